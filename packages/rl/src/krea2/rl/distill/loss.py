"""TDM's and DMD's loss pieces as pure functions, each under its formula.

All tensors are latents [B, C, H, W] in float32 unless noted; "per sample" results are [B].
Flow convention (contract 5): x_t = (1 − t)·x0 + t·ε, v = ε − x0, so a velocity at x_t gives
x0 = x_t − t·v and ε = x_t + (1 − t)·v.

CFG. krea2's ``guided_velocity(v_c, v_u, w) = v_c + w·(v_c − v_u)`` is Ho's
v_u + g·(v_c − v_u) at g = w + 1. Papers (TDM, DMD, DMD2) give g; :func:`krea_guidance`
converts. x0 is affine in v, so the same combination holds for x0 predictions.

DMD's generator gradient is (x0_fake − x0_real) at the re-noised point (the score
difference in x0 units). It is applied as a regression of the student's x̂0 to the
stop-gradient target x̂0 + Δ, Δ = x0_real − x0_fake (so the step moves x̂0 towards the
teacher and away from the fake), divided per sample by mean |x̂0 − x0_real| (DMD's
normaliser: the step size no longer depends on the latents' scale or how far the student
is from the teacher).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def krea_guidance(g: float) -> float:
    """krea2's CFG scale w for Ho's scale g: w = g − 1 (g = 1: no guidance, w = 0)."""
    return g - 1.0


def _col(t: Tensor, like: Tensor) -> Tensor:
    return t.to(like.device, like.dtype).view(-1, *[1] * (like.dim() - 1))


def x0_from_velocity(x: Tensor, t: Tensor, v: Tensor) -> Tensor:
    """x0 = x_t − t·v (t [B])."""
    return x - _col(t, x) * v


def noise_from_velocity(x: Tensor, t: Tensor, v: Tensor) -> Tensor:
    """ε = x_t + (1 − t)·v (t [B])."""
    return x + (1 - _col(t, x)) * v


def pseudo_huber(diff: Tensor, c: float | None) -> Tensor:
    """Elementwise √(d² + c²) − c: d²/(2c) for |d| ≪ c, |d| − c for |d| ≫ c. ``c`` > 0 in
    the latent's units; None: the squared error d² (TDM's loss without ``use_huber``)."""
    if c is None:
        return diff.square()
    sq = diff.square()
    # the same value written without cancellation: √(d² + c²) − c loses every digit of a
    # d far below c in float32
    return sq / (torch.sqrt(sq + c * c) + c)


def dmd_normaliser(x0: Tensor, x0_teacher_cfg: Tensor, floor: float = 1e-8) -> Tensor:
    """Per sample: mean |x̂0 − x0_teacher_cfg| (detached), floored so a student that has
    reached the teacher does not divide by 0."""
    return (x0.detach() - x0_teacher_cfg).abs().flatten(1).mean(1).clamp_min(floor)


@dataclass
class TeacherTerms:
    """Δ and its two parts (each [B, C, H, W]): ``cfg`` = w·(x0_cond − x0_uncond) (the
    CFG augmentation) and ``dm`` = x0_cond − x0_fake (distribution matching), and the
    teacher's guided x0 ``x0_teacher_cfg`` = x0_cond + cfg."""

    delta: Tensor
    cfg: Tensor
    dm: Tensor
    x0_teacher_cfg: Tensor


def teacher_terms(
    x0_cond: Tensor,
    x0_uncond: Tensor | None,
    x0_fake: Tensor,
    w: float,
    split: bool = False,
    cfg_weight: float = 1.0,
    dm_weight: float = 1.0,
) -> TeacherTerms:
    """Δ = x0_teacher_cfg − x0_fake = cfg + dm (TDM's target offset), or with ``split``
    (decoupled DMD) cfg_weight·cfg + dm_weight·dm. ``w``: krea2's scale (Ho's g − 1);
    ``x0_uncond`` may be None when w = 0."""
    cfg = w * (x0_cond - x0_uncond) if x0_uncond is not None and w else torch.zeros_like(x0_cond)
    dm = x0_cond - x0_fake
    delta = cfg_weight * cfg + dm_weight * dm if split else cfg + dm
    return TeacherTerms(delta, cfg, dm, x0_cond + cfg)


def student_loss(x0: Tensor, delta: Tensor, normaliser: Tensor, c: float | None) -> Tensor:
    """Per sample: mean over elements of pseudo_huber(x̂0 − sg(x̂0 + Δ)) / normaliser.
    ``x0`` carries the student's gradient; ``delta`` and ``normaliser`` [B] are constants.
    With c = None its gradient in x̂0 is −2Δ / (normaliser · elements)."""
    target = (x0.detach() + delta).detach()
    per = pseudo_huber(x0 - target, c).flatten(1).mean(1)
    return per / normaliser


def normalised_dmd_gradient(delta: Tensor, normaliser: Tensor) -> Tensor:
    """The DMD step direction in x̂0 per unit normaliser, −Δ / normaliser [B, C, H, W]
    (the squared-error loss's gradient up to 2 / elements): unchanged when every latent
    (student, teacher, fake) is scaled by the same factor."""
    return -delta / _col(normaliser, delta)


def snr_weight(t: Tensor, cap: float) -> Tensor:
    """min(SNR, cap) per sample, SNR = ((1 − t)/t)² (t [B] in (0, 1))."""
    return ((1 - t) / t).square().clamp_max(cap)


def importance_weight(mixed: Tensor, noise: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """TDM's weight for a fake-score sample whose noise is ``mixed`` instead of Gaussian
    ``noise``: exp(−½·mean m²) / exp(−½·mean n²) per sample (element means: a per-element
    density ratio), clipped at ``clip``. Returns (weights [B], clipped [B] bool)."""
    log_w = 0.5 * (
        noise.float().square().flatten(1).mean(1) - mixed.float().square().flatten(1).mean(1)
    )
    w = log_w.exp()
    return w.clamp_max(clip), w > clip


def fake_score_loss(
    x0_fake: Tensor, x0_sample: Tensor, t: Tensor, weight: Tensor, cap: float
) -> Tensor:
    """Per sample: min(SNR(τ), cap)·weight·mean (x0_fake − x̂0)², the fake score's
    denoising loss in x0 space on the student's detached samples ``x0_sample``."""
    err = (x0_fake - x0_sample.detach()).square().flatten(1).mean(1)
    return snr_weight(t.to(err.device), cap) * weight.to(err.device) * err
