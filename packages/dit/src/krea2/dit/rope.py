"""3-axis rotary position embedding on adjacent pairs (Flux-style), with partial rotation."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_angles(pos: Tensor, axes: tuple[int, ...], theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin for positions pos [..., L, n_axes] -> each [..., L, sum(axes) // 2] fp32.

    Axis a of width d_a uses frequencies theta^(-2k/d_a), k < d_a/2; angles in float64
    (float32 on devices without it), axes concatenated in order.
    """
    f64 = torch.float32 if pos.device.type == "mps" else torch.float64
    parts = []
    for a, d in enumerate(axes):
        if d == 0:
            continue
        k = torch.arange(0, d, 2, dtype=f64, device=pos.device)
        freqs = 1.0 / (theta ** (k / d))
        parts.append(pos[..., a].to(f64)[..., None] * freqs)
    angles = torch.cat(parts, dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs of the first 2*cos.shape[-1] dims of x [B, L, H, hd].

    cos/sin: [B or 1, L, R/2]. Pair (x[2k], x[2k+1]) -> (x0 cos - x1 sin, x0 sin + x1 cos);
    computed in fp32 and cast back; dims past R pass through (partial RoPE).
    """
    r = 2 * cos.shape[-1]
    rot, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
    pairs = rot.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2).to(x.dtype)
    return out if rest is None else torch.cat([out, rest], dim=-1)
