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
    out = _Rotate.apply(rot.float(), cos.unsqueeze(-2), sin.unsqueeze(-2)).to(x.dtype)
    return out if rest is None else torch.cat([out, rest], dim=-1)


class _Rotate(torch.autograd.Function):
    """Pairwise rotation of x [..., R] by angles with cos/sin [..., R/2] (broadcast).

    The map is linear in x, so backward is the rotation by the opposite angle and nothing
    of x's size is saved; forward and backward are four passes each (autograd of the
    composite makes about twice as many, with zero-filled buffers for the pair slices).
    """

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """(x0 cos - x1 sin, x0 sin + x1 cos) per pair; x [..., R], cos/sin [..., R/2]."""
    pairs = x.unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    if torch.compiler.is_compiling():
        # Dynamo does not trace `out=` into views; inductor fuses this form into one kernel.
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    out = torch.empty(pairs.shape, dtype=x.dtype, device=x.device)
    torch.mul(x0, cos, out=out[..., 0]).addcmul_(x1, sin, value=-1)
    torch.mul(x0, sin, out=out[..., 1]).addcmul_(x1, cos)
    return out.flatten(-2)
