"""Small building blocks: zero-centered fp32 RMSNorm, SwiGLU, timestep sinusoid, learned tables."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a zero-centered gain (`1 + scale`), computed in fp32.

    The parameter is named `scale` (checkpoint key) and is created in fp32.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim, dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:
        """x [..., dim] -> same shape and dtype."""
        gain = self.scale.float() + 1.0
        return F.rms_norm(x.float(), (self.dim,), gain, self.eps).to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.scale)


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
