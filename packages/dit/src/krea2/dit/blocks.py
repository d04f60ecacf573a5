"""Transformer blocks: the text-fusion block, the single-stream block and the final layer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from krea2.dit.attention import Attention
from krea2.dit.layers import LearnedTable, RMSNorm, SwiGLU


class TextFusionBlock(nn.Module):
    """Plain pre-norm block: `x += Attn(norm(x)); x += SwiGLU(norm(x))` (no RoPE, no time)."""

    def __init__(
        self, dim: int, heads: int, kv_heads: int, hidden: int, eps: float, gate: bool
    ) -> None:
        super().__init__()
        self.prenorm = RMSNorm(dim, eps)
        self.postnorm = RMSNorm(dim, eps)
        self.attn = Attention(dim, heads, kv_heads, eps, gate=gate)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x [B, L, dim]; mask bool [B, 1, 1, L] or None."""
        x = x + self.attn(self.prenorm(x), mask=mask)
        return x + self.mlp(self.postnorm(x))


class SingleStreamBlock(nn.Module):
    """The main block over the joint [text, image] sequence.

    With modulation (the release): `m = tvec + mod.lin` gives prescale, preshift, pregate,
    postscale, postshift, postgate (each [B, 1, D]) and
    `x += pregate * Attn((1 + prescale) * norm(x) + preshift)`, likewise for the SwiGLU.
    Without (in-context time tokens ablation) it is a plain pre-norm block.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int,
        hidden: int,
        eps: float,
        gate: bool = True,
        modulated: bool = True,
    ) -> None:
        super().__init__()
        self.mod = LearnedTable(6 * dim) if modulated else None
        self.prenorm = RMSNorm(dim, eps)
        self.postnorm = RMSNorm(dim, eps)
        self.attn = Attention(dim, heads, kv_heads, eps, gate=gate)
        self.mlp = SwiGLU(dim, hidden)

    def forward(
        self,
        x: Tensor,
        tvec: Tensor | None,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor | None = None,
        out_start: int = 0,
    ) -> Tensor:
        """x [B, L, D]; tvec [B, 1, 6D] (None without modulation) -> [B, L - out_start, D].

        out_start > 0 computes only the rows x[:, out_start:] (all tokens still serve as keys):
        the last block's text rows are never read, so it skips their queries and MLP.
        """
        rows = x[:, out_start:] if out_start else x
        if self.mod is None:
            rows = rows + self.attn(self.prenorm(x), rope, mask, out_start)
            return rows + self.mlp(self.postnorm(rows))
        m = tvec + self.mod.lin
        prescale, preshift, pregate, postscale, postshift, postgate = m.chunk(6, dim=-1)
        h = self.prenorm(x, prescale, preshift)
        # addcmul: the gated residual in one pass (same gradients as x + gate * y).
        rows = torch.addcmul(rows, pregate, self.attn(h, rope, mask, out_start))
        return torch.addcmul(rows, postgate, self.mlp(self.postnorm(rows, postscale, postshift)))


class LastLayer(nn.Module):
    """`linear((1 + scale) * norm(x) + shift)` with (scale, shift) = temb + modulation.lin."""

    def __init__(self, dim: int, out: int, eps: float, modulated: bool = True) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, eps)
        self.linear = nn.Linear(dim, out, bias=True)
        self.modulation = LearnedTable(2, dim) if modulated else None

    def forward(self, x: Tensor, temb: Tensor | None) -> Tensor:
        """x [B, N, D]; temb [B, 1, D] (raw timestep-MLP output) -> [B, N, out]."""
        if self.modulation is None:
            return self.linear(self.norm(x))
        scale, shift = (temb + self.modulation.lin).chunk(2, dim=1)
        return self.linear(self.norm(x, scale, shift))
