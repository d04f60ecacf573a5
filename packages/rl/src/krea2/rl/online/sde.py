"""Flow rollouts as an SDE with the log-probability of every stochastic transition.

Our convention (``krea2.dit.flow``): x_t = (1 - t) x_0 + t ε, t = 1 is noise, the model
predicts v = ε - x_0. Given v at (x, t), x_0 = x - t v and ε = x + (1 - t) v, so the score
is ∇ log p_t(x) = -E[ε | x] / t = -(x + (1 - t) v) / t. The reverse-time SDE with the same
marginals as the probability-flow ODE dx = v dt, for a diffusion level σ_t, is

    dx = [v + σ_t² / (2 t) · (x + (1 - t) v)] dt + σ_t dW      (dt < 0: from noise to data)

and its Euler-Maruyama step from t to t' < t (Δ = t - t' > 0) is a Gaussian transition

    x' ~ N(μ, s² I),  μ = x - Δ [v + σ_t² / (2 t) (x + (1 - t) v)],  s = σ_t √Δ,

with σ_t = a √(t / (1 - t)) (Flow-GRPO's schedule; ``a`` is the noise level). σ_t is
infinite at t = 1, so the first step uses t = the grid's second time for σ. docs/rl.md
writes the derivation out. Outside the SDE window the steps are plain Euler (a = 0 gives
μ = the Euler step exactly).

The log-probability of a transition is the Gaussian's, averaged over the latent's
elements (not summed: a per-element ratio stays near 1 at any resolution, as Flow-GRPO).
:func:`transition` is the one function both the rollout and the training loss call, so
the first inner step's importance ratio is exactly 1 when the batch shapes match.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

Velocity = Callable[[Tensor, Tensor], Tensor]  # velocity(x [B, C, H, W], t [B]) -> v float32


def sigma_at(t: float, t_cap: float, noise_level: float) -> float:
    """σ_t = a √(t / (1 - t)) with t capped at ``t_cap`` (< 1, the grid's second time)."""
    tc = min(t, t_cap)
    return noise_level * math.sqrt(tc / max(1.0 - tc, 1e-12))


def transition(x: Tensor, v: Tensor, t: float, t_next: float, sigma: float) -> tuple[Tensor, float]:
    """The mean μ [B, C, H, W] float32 and std s (a float) of the step t → t_next from state
    x (float32) with velocity v (float32). ``sigma`` = 0 gives the Euler step, s = 0."""
    dt = t - t_next
    if sigma == 0.0:
        return x - dt * v, 0.0
    drift = v + (sigma * sigma / (2.0 * t)) * (x + (1.0 - t) * v)
    return x - dt * drift, sigma * math.sqrt(dt)


def log_prob(x_next: Tensor, mean: Tensor, std: float) -> Tensor:
    """log N(x_next; mean, std² I) per row, averaged over the elements: [B] float32."""
    var = std * std
    lp = -((x_next.float() - mean) ** 2) / (2 * var) - math.log(std) - 0.5 * math.log(2 * math.pi)
    return lp.flatten(1).mean(1)


@dataclass
class Rollout:
    """One batch of rollouts (B images).

    ``states`` [W, B, C, H, W] float32: the state before each SDE step of the window;
    ``next_states`` [W, B, C, H, W]: the state each step drew; ``log_probs`` [W, B] float32:
    each draw's log-probability under the rollout policy; ``means`` [W, B, C, H, W]: the
    policy's means (kept for the KL term); ``sigmas`` [W] each step's σ_t and ``stds`` [W]
    its transition std; ``window`` the step indices;
    ``times`` [S + 1] float64 grid; ``x0`` [B, C, H, W] the final latents (float32)."""

    states: Tensor
    next_states: Tensor
    log_probs: Tensor
    means: Tensor
    sigmas: list[float]
    stds: list[float]
    window: list[int]
    times: Tensor
    x0: Tensor


def window_sigmas(times: Tensor, window: Sequence[int], noise_level: float) -> list[float]:
    """σ of each step of the grid: ``noise_level``'s σ_t on the window's steps, 0 elsewhere."""
    t_cap = float(times[1]) if len(times) > 2 else 0.5
    inside = set(window)
    return [
        sigma_at(float(times[i]), t_cap, noise_level) if i in inside else 0.0
        for i in range(len(times) - 1)
    ]


@torch.no_grad()
def sde_rollout(
    velocity: Velocity,
    noise: Tensor,
    times: Tensor,
    window: Sequence[int],
    noise_level: float,
    generators: Sequence[torch.Generator],
    dtype: torch.dtype = torch.float32,
) -> Rollout:
    """Integrate noise [B, C, H, W] from times[0] = 1 to times[-1] = 0: SDE steps on
    ``window`` (step indices), Euler elsewhere. Row b's step noise comes from
    ``generators[b]`` (drawn on CPU in row order, so a row's rollout does not depend on its
    batch), the velocity sees the state cast to ``dtype`` (the model's) and t as float32 [B].
    """
    if len(generators) != noise.shape[0]:
        raise ValueError(f"{len(generators)} generators for {noise.shape[0]} rows")
    sigmas = window_sigmas(times, window, noise_level)
    x = noise.float()
    states, nexts, lps, means, stds, used = [], [], [], [], [], []
    shape = tuple(x.shape[1:])
    for i in range(len(times) - 1):
        t, t_next = float(times[i]), float(times[i + 1])
        tb = torch.full((x.shape[0],), t, device=x.device)
        v = velocity(x.to(dtype), tb).float()
        mean, std = transition(x, v, t, t_next, sigmas[i])
        if std == 0.0:
            x = mean
            continue
        eps = torch.stack([torch.randn(shape, generator=g) for g in generators]).to(x.device)
        x_next = mean + std * eps
        states.append(x)
        nexts.append(x_next)
        lps.append(log_prob(x_next, mean, std))
        means.append(mean)
        stds.append(std)
        used.append(sigmas[i])
        x = x_next
    empty = x.new_zeros((0, *x.shape))
    return Rollout(
        states=torch.stack(states) if states else empty,
        next_states=torch.stack(nexts) if nexts else empty,
        log_probs=torch.stack(lps) if lps else x.new_zeros((0, x.shape[0])),
        means=torch.stack(means) if means else empty,
        sigmas=used,
        stds=stds,
        window=[i for i in range(len(times) - 1) if sigmas[i] > 0],
        times=times,
        x0=x,
    )


def step_log_prob(
    velocity: Velocity,
    rollout: Rollout,
    k: int,
    rows: slice,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """The log-probability [n] (with grad through ``velocity``) of the window's k-th draw
    for ``rows`` of the rollout, and the policy's mean [n, C, H, W], with exactly the
    rollout's arithmetic (:func:`transition`); the rows must be the ones the rollout's
    velocity saw together for the ratio to be 1 to the last bit."""
    i = rollout.window[k]
    t, t_next = float(rollout.times[i]), float(rollout.times[i + 1])
    x = rollout.states[k, rows]
    tb = torch.full((x.shape[0],), t, device=x.device)
    v = velocity(x.to(dtype), tb).float()
    mean, std = transition(x, v, t, t_next, rollout.sigmas[k])
    return log_prob(rollout.next_states[k, rows], mean, std), mean
