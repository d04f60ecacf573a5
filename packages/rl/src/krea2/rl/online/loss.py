"""The two objectives on one set of rollouts.

GRPO (clipped importance ratio, Flow-GRPO style): per image and SDE step,
ratio = exp(log π_θ(x' | x) - log π_old(x' | x)) and
loss = -min(ratio A, clip(ratio, 1 - ε, 1 + ε) A), plus β_KL · KL(π_θ ‖ π_ref) where both
transitions are Gaussians with the same std s: KL = ‖μ_θ - μ_ref‖² / (2 s²), averaged
over elements as the log-probabilities are.

DiffusionNFT (Zheng et al. 2025): no log-probabilities. On the rollouts' clean samples
x_0 with optimality r ∈ [0, 1] (from the advantage), a forward-process point
x_t = (1 - t) x_0 + t ε and the rollout policy's velocity v_old there, the implicit
positive and negative policies are v⁺ = (1 - β) v_old + β v_θ and
v⁻ = (1 + β) v_old - β v_θ, and the loss is r ‖v⁺ - (ε - x_0)‖² + (1 - r) ‖v⁻ - (ε - x_0)‖²
(per-element mean). High-reward samples pull v_θ towards them, low-reward ones push it away.
With ``adaptive`` weighting (DiffusionNFT's default) each term is measured on the clean
sample instead: x̂_0 = x_t - t v for v = v⁺ or v⁻, and ‖x̂_0 - x_0‖² divided by its own
detached mean |x̂_0 - x_0|, so every sample and time contributes an error of the same scale
(a velocity error counts t times as much at time t, then the normalisation removes the
sample's overall error size).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def grpo_terms(
    logp: Tensor, logp_old: Tensor, adv: Tensor, clip: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row clipped surrogate loss [n], the ratio [n] (detached) and whether each row
    was clipped [n] (float). ``logp``/``logp_old``/``adv`` [n]."""
    ratio = torch.exp(logp - logp_old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = ((ratio - 1.0).abs() > clip).float()
    return loss, ratio.detach(), was_clipped.detach()


def gaussian_kl(mean: Tensor, mean_ref: Tensor, std: float) -> Tensor:
    """KL between N(mean, s²I) and N(mean_ref, s²I), averaged over elements: [n]."""
    return ((mean.float() - mean_ref.float()) ** 2).flatten(1).mean(1) / (2.0 * std * std)


def optimality(adv: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """DiffusionNFT's r ∈ [0, 1] from advantages: 0.5 + 0.5 clip(A / scale, -1, 1)."""
    return 0.5 + 0.5 * np.clip(np.asarray(adv, np.float64) / scale, -1.0, 1.0)


def nft_terms(v: Tensor, v_old: Tensor, target: Tensor, r: Tensor, beta: float) -> Tensor:
    """DiffusionNFT's per-row loss [n]: r ‖v⁺ - target‖² + (1 - r) ‖v⁻ - target‖²
    (element means), v⁺ = (1 - β) v_old + β v, v⁻ = (1 + β) v_old - β v; all [n, C, H, W]
    (``v`` with grad), r [n]."""
    v, v_old, target = v.float(), v_old.float(), target.float()
    pos = ((1.0 - beta) * v_old + beta * v - target).square().flatten(1).mean(1)
    neg = ((1.0 + beta) * v_old - beta * v - target).square().flatten(1).mean(1)
    return r * pos + (1.0 - r) * neg


def _normalised_x0_error(x0_hat: Tensor, x0: Tensor) -> Tensor:
    """‖x̂_0 - x_0‖² / sg(mean |x̂_0 - x_0|) per row [n] (element means; floor 1e-5)."""
    err = x0_hat - x0
    scale = err.detach().abs().flatten(1).mean(1).clamp_min(1e-5)
    return err.square().flatten(1).mean(1) / scale


def nft_terms_adaptive(
    v: Tensor, v_old: Tensor, x_t: Tensor, t: Tensor, x0: Tensor, r: Tensor, beta: float
) -> Tensor:
    """DiffusionNFT's per-row loss [n] with adaptive weighting: as :func:`nft_terms` but
    each policy's error measured on its clean-sample prediction x̂_0 = x_t - t v⁺ (or v⁻)
    and normalised by its detached mean absolute error. ``x_t``/``x0`` [n, C, H, W], ``t``
    [n] in [0, 1] (1 is noise)."""
    v, v_old, x_t, x0 = v.float(), v_old.float(), x_t.float(), x0.float()
    tt = t.float().view(-1, *([1] * (v.ndim - 1)))
    pos = _normalised_x0_error(x_t - tt * ((1.0 - beta) * v_old + beta * v), x0)
    neg = _normalised_x0_error(x_t - tt * ((1.0 + beta) * v_old - beta * v), x0)
    return r * pos + (1.0 - r) * neg
