"""Small building blocks: zero-centered fp32 RMSNorm, SwiGLU, timestep sinusoid, learned tables."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a zero-centered gain (`1 + scale`), computed in fp32.

    The parameter is named `scale` (checkpoint key) and is created in fp32. Called with
    `mod_scale`/`mod_shift` it also applies the adaLN modulation in the same pass:
    `norm(x) * (1 + mod_scale) + mod_shift`.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim, dtype=torch.float32))

    def forward(
        self, x: Tensor, mod_scale: Tensor | None = None, mod_shift: Tensor | None = None
    ) -> Tensor:
        """x [..., dim]; mod_scale/mod_shift broadcast to x (e.g. [B, 1, dim]) -> x's shape."""
        weight = self.scale.float() + 1.0
        if mod_scale is not None:
            weight = weight * (1 + mod_scale.float())
        shift = None if mod_shift is None else mod_shift.float()
        return _AffineRMSNorm.apply(x, weight, shift, self.eps)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.scale)


class _AffineRMSNorm(torch.autograd.Function):
    """`x * rsqrt(mean(x^2) + eps) * weight + shift` in fp32, cast back to x's dtype.

    Autograd of the composite (`F.rms_norm`, then the modulation's mul and add) makes about
    a dozen full passes over [B, L, D] and saves several of them; this saves only x and the
    per-row rstd [..., 1] and does the backward in six passes.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, shift: Tensor | None, eps: float) -> Tensor:
        xf = x.float()
        # mean(x^2) as ||x||^2 / D: one pass instead of square() + mean().
        ms = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1])
        rstd = ms.add_(eps).rsqrt_()
        out = xf * rstd
        out = out.mul_(weight) if shift is None else torch.addcmul(shift, out, weight)
        ctx.save_for_backward(x, rstd, weight)
        ctx.shift_shape = None if shift is None else shift.shape
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, rstd, weight = ctx.saved_tensors
        g = grad.float()
        n = x.float() * rstd
        gw = g * weight
        # d/dx of n = x * rstd: rstd * (gw - n * mean(gw * n)).
        dot = torch.linalg.vecdot(gw, n).unsqueeze(-1).div_(-x.shape[-1])
        grad_x = torch.addcmul(gw, n, dot).mul_(rstd).to(x.dtype)
        grad_weight = (g * n).sum_to_size(weight.shape) if ctx.needs_input_grad[1] else None
        grad_shift = None
        if ctx.shift_shape is not None and ctx.needs_input_grad[2]:
            grad_shift = g.sum_to_size(ctx.shift_shape)
        return grad_x, grad_weight, grad_shift, None


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`, no biases."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., dim] -> [..., dim]."""
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LearnedTable(nn.Module):
    """A zero-initialised learned tensor named `lin` (the per-block modulation bias)."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.lin = nn.Parameter(torch.zeros(*shape))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.lin)


def timestep_sinusoid(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal embedding of flow time t [B] in [0, 1] -> [B, 1, dim] fp32, cos half first.

    The argument is t * 1000 and the frequencies are exp(-ln(1e4) * k / (dim/2)).
    """
    half = dim // 2
    k = torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(-math.log(1e4) * k / half)
    args = (t.float() * 1e3)[:, None, None] * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
