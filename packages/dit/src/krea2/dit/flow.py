"""Rectified-flow conventions: interpolation, targets, the mu time shift and training times.

Convention (docs/architecture.md, contract 5): x_t = (1 - t) x_data + t noise, t = 1 is noise, the
model predicts v = noise - x_data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from krea2.infra.errors import UserError

# The release's shift line: mu = 0.5 at 256 image tokens (256^2 px), 1.15 at 6400 (1280^2).
MU_X1, MU_Y1, MU_X2, MU_Y2 = 256, 0.5, 6400, 1.15
TURBO_MU = 1.15  # Turbo was distilled at this mu and uses it at every resolution
TURBO_STEPS = 8  # ... in 8 steps without CFG (the release's recommended settings)


def resolution_mu(image_tokens: int, x1=MU_X1, y1=MU_Y1, x2=MU_X2, y2=MU_Y2) -> float:
    """mu linear in the image-token count, not clamped: 1024 tokens (512^2) -> 0.58125."""
    slope = (y2 - y1) / (x2 - x1)
    return y1 + slope * (image_tokens - x1)


@dataclass(frozen=True)
class TimeShift:
    """How a sampler picks mu: `fixed` when set (Turbo: 1.15; a trained stage's shift),
    else linear in the image-token count through (x1, y1) and (x2, y2), the release's line
    by default (a diffusers scheduler's base/max shift and sequence lengths)."""

    fixed: float | None = None
    x1: float = MU_X1
    y1: float = MU_Y1
    x2: float = MU_X2
    y2: float = MU_Y2

    def mu(self, image_tokens: int) -> float:
        """mu for an image of `image_tokens` tokens."""
        if self.fixed is not None:
            return self.fixed
        return resolution_mu(image_tokens, self.x1, self.y1, self.x2, self.y2)

    def __str__(self) -> str:
        if self.fixed is not None:
            return f"mu {self.fixed:g}"
        return f"mu {self.y1:g} at {self.x1:g} to {self.y2:g} at {self.x2:g} image tokens"


def image_tokens(height: int, width: int, factor: int = 16) -> int:
    """Image tokens for a pixel size: (H / factor) * (W / factor), factor = AE factor * patch."""
    if height % factor or width % factor:
        raise UserError(
            f"size {width}x{height} is not divisible by {factor} (autoencoder factor x patch); "
            f"round it to a multiple of {factor}"
        )
    return (height // factor) * (width // factor)


def shift_time(t: Tensor, mu: float, sigma: float = 1.0) -> Tensor:
    """The exponential shift e^mu / (e^mu + (1/t - 1)^sigma); maps 0 -> 0 and 1 -> 1."""
    t = torch.as_tensor(t, dtype=torch.float64)
    inner = (1.0 / t.clamp_min(1e-300) - 1.0).clamp_min(0.0) ** sigma
    out = math.exp(mu) / (math.exp(mu) + inner)
    return torch.where(t <= 0, torch.zeros_like(out), out)


def sampling_times(steps: int, mu: float, sigma: float = 1.0) -> Tensor:
    """Euler grid [steps + 1] float64 from 1 (noise) to 0: shift_time(linspace(1, 0))."""
    if steps <= 0:
        raise UserError(f"steps={steps} must be a positive number of sampling steps")
    return shift_time(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64), mu, sigma)


def turbo_times(steps: int = 8) -> Tensor:
    """The Turbo grid: mu fixed at 1.15. 8 steps: 1.0, 0.9567, 0.9045, ..., 0.3109, 0.0."""
    return sampling_times(steps, TURBO_MU)


def sample_training_times(
    n: int,
    mu: float = 0.0,
    loc: float = 0.0,
    scale: float = 1.0,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Shifted logit-normal times [n] fp32 in (0, 1): shift_time(sigmoid(N(loc, scale)), mu).

    `mu` is the per-stage shift (e.g. resolution_mu of the stage's token count, or a swept
    value); mu = 0 is the plain logit-normal.
    """
    z = torch.randn(n, generator=generator, device=device or "cpu", dtype=torch.float64)
    u = torch.sigmoid(loc + scale * z)
    return shift_time(u, mu).float().to(device or "cpu")


def interpolate(data: Tensor, noise: Tensor, t: Tensor) -> Tensor:
    """x_t = (1 - t) data + t noise; t [B] broadcast over the remaining dims."""
    tt = t.to(data.dtype).view(-1, *([1] * (data.ndim - 1)))
    return (1 - tt) * data + tt * noise


def velocity_target(data: Tensor, noise: Tensor) -> Tensor:
    """The regression target v = noise - data."""
    return noise - data


def guided_velocity(v_cond: Tensor, v_uncond: Tensor, w: float) -> Tensor:
    """Krea's CFG: v_c + w (v_c - v_u); w = 0 is no guidance (equals usual CFG scale 1 + w)."""
    return v_cond + w * (v_cond - v_uncond)
