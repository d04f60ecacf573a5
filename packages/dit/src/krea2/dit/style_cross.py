"""The style module's spatial path: tile-pooled reference tokens and decoupled attention.

With ``StyleConfig(pool="tiles", cross=K)`` a reference becomes a g × g grid of tokens (the
means of its patch features over g × g tiles, each with the sin-cos code of its tile's
centre), and before each of the DiT's first K blocks the image rows attend to those tokens
with the module's own projections (IP-Adapter's decoupled attention), their queries
carrying the code of their own position. A zero key and value (a sink) sits beside the
tokens, so a reference's strength s, the bias log s on its keys, sets its share against
the sink: s = 0 adds nothing, and several references mix by their strengths. The output
projection starts at zero, so an untrained path changes nothing.

Why (docs/design/demo.md, "What reference tokens carry on a frozen toy base"): tokens in
the stream at the text's RoPE position reach every image row alike, a colour shift; ramps,
textures and objects need changes that depend on where a row is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from krea2.dit.layers import RMSNorm

STYLE_POOLS = ("attention", "tiles")  # StyleConfig.pool: learned queries, or a grid of tile means


def sincos_at(ij: Tensor, dim: int) -> Tensor:
    """Fixed 2-D position code of positions ij [N, 2] (row, column; float, in patches) ->
    [N, dim] float32: dim/4 sin and dim/4 cos features of the row, then of the column, at
    frequencies 10000^(-k / (dim/4)) (MAE's code, at any position)."""
    quarter = dim // 4
    freqs = torch.exp(-math.log(1e4) * torch.arange(quarter, device=ij.device) / quarter)
    parts = []
    for axis in range(2):
        angles = ij[:, axis].float().reshape(-1, 1) * freqs
        parts += [angles.sin(), angles.cos()]
    return torch.cat(parts, dim=-1)


def tile_pool(x: Tensor, grid_h: int, grid_w: int, tokens: int) -> Tensor:
    """Patch features x [B', grid_h * grid_w, D] (row-major) -> [B', tokens, D]: the means
    over a g × g grid of tiles (g = sqrt(tokens), row-major), each plus the code of its
    centre in patch units (so a tile's token and the image rows below it share a code)."""
    g = math.isqrt(tokens)
    grid = x.unflatten(1, (grid_h, grid_w)).permute(0, 3, 1, 2)  # [B', D, gh, gw]
    pooled = F.adaptive_avg_pool2d(grid, g).flatten(2).transpose(1, 2)  # [B', g*g, D]
    steps = torch.arange(g, device=x.device, dtype=torch.float32) + 0.5
    rows, cols = steps * grid_h / g - 0.5, steps * grid_w / g - 0.5
    centres = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(-1, 2)
    return pooled + sincos_at(centres, x.shape[-1]).to(pooled.dtype)


class StyleCross(nn.Module):
    """One block's decoupled attention: image rows [B, N, D] (plus their positions' code
    [N, D]) attend to the style tokens [B, S, D] and a zero sink; the tokens' keys take the
    bias [B, S] (log s, -inf = off). Returns the rows' update [B, N, D]."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = RMSNorm(width)
        self.wq = nn.Linear(width, width, bias=False)
        self.wk = nn.Linear(width, width, bias=False)
        self.wv = nn.Linear(width, width, bias=False)
        self.wo = nn.Linear(width, width, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A zero output projection: the untrained path adds nothing."""
        nn.init.zeros_(self.wo.weight)

    def forward(self, rows: Tensor, code: Tensor, tokens: Tensor, bias: Tensor) -> Tensor:
        b, _, d = rows.shape
        hd = d // self.heads
        q = self.wq(self.norm(rows) + code.to(rows.dtype))
        q = q.unflatten(-1, (-1, hd)).transpose(1, 2)  # [B, H, N, hd]
        k = self.wk(tokens).unflatten(-1, (-1, hd)).transpose(1, 2)  # [B, H, S, hd]
        v = self.wv(tokens).unflatten(-1, (-1, hd)).transpose(1, 2)
        sink = k.new_zeros(b, self.heads, 1, hd)
        k, v = torch.cat([sink, k], dim=2), torch.cat([sink, v], dim=2)
        mask = torch.cat([bias.new_zeros(b, 1), bias], dim=1)[:, None, None].to(rows.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).flatten(2))


def cross_params(width: int, blocks: int) -> int:
    """Parameters of `blocks` StyleCross layers of `width`: a norm and four D × D each."""
    return blocks * (width + 4 * width * width)


def cross_flops(width: int, blocks: int, image_tokens: int, style_tokens: int) -> int:
    """Matmul and attention FLOPs of `blocks` StyleCross layers for one image at one step
    (q and o over the image rows, k and v over the tokens, scores and mixing with the sink)."""
    per = 2 * 2 * image_tokens * width * width + 2 * 2 * style_tokens * width * width
    per += 2 * 2 * image_tokens * (style_tokens + 1) * width
    return blocks * per


__all__ = ["STYLE_POOLS", "StyleCross", "cross_flops", "cross_params", "sincos_at", "tile_pool"]
