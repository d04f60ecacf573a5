"""The student's trajectory: its K-step rollout, the intervals its steps own, and where a
step's prediction is re-noised for the scores to judge it.

The student runs K Euler steps on ``times`` = ``flow.sampling_times(K, mu)`` (times[0] = 1,
times[K] = 0). Step k goes from times[k] to times[k + 1] and owns the interval
[times[k + 1], times[k]]; the K intervals tile [0, 1]. An Euler step is DDIM for rectified
flow: from x at t with velocity v, the clean estimate is x̂0 = x − t·v and the noise
estimate ε̂ = x + (1 − t)·v, and x + (s − t)·v = (1 − s)·x̂0 + s·ε̂.

TDM (Luo et al. 2025, ``train_tdm_demo.py``) judges step k's prediction inside its own
interval: it moves x̂0 along the student's own ODE to a time s in the interval (the point
the student's trajectory passes), then adds fresh noise to a time τ ≥ s, also in the
interval. The scores then see x_τ = (1 − τ)·x̂0 + τ·m with a "mixed" noise m that is only
partly Gaussian. DMD2 re-noises x̂0 with fresh Gaussian noise at any time (s = 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from krea2.rl.distill.config import DistillMode, Intervals

# Query times stay off the ends, as TDM's (20, T − 10) of 1000 steps: at τ → 0 every score
# returns its input (nothing to learn), at τ → 1 the SNR weight is 0.
T_MIN, T_MAX = 0.02, 0.99


def stage_intervals(times: Tensor) -> list[tuple[float, float]]:
    """[(lo, hi)] of each student step k: (times[k + 1], times[k]). ``times`` [K + 1] runs
    from 1 down to 0, so the intervals tile [0, 1] and share only their ends."""
    t = [float(v) for v in times]
    return [(t[k + 1], t[k]) for k in range(len(t) - 1)]


@dataclass
class StagePoints:
    """Per sample: the student step it trains (``stage`` [B] long), that step's input time
    (``t_in`` [B]), the ODE time s (``t_mid`` [B]) and query time τ (``t_query`` [B]),
    float32 flow times, and the fresh noise (``noise`` [B, C, H, W] float32)."""

    stage: Tensor
    t_in: Tensor
    t_mid: Tensor
    t_query: Tensor
    noise: Tensor


def draw_points(
    generators: list[torch.Generator],
    times: Tensor,
    shape: tuple[int, ...],
    mode: DistillMode,
    intervals: Intervals,
    random_mid: bool,
) -> StagePoints:
    """One draw per sample from its own generator (so any split of the batch over ranks
    draws the same numbers): step k uniform in 0..K−1, then s and τ (module docstring;
    ``intervals`` and ``random_mid`` apply to TDM), then noise of ``shape``."""
    spans = stage_intervals(times)
    ks, t_in, t_mid, t_query, noises = [], [], [], [], []
    for g in generators:
        k = int(torch.randint(0, len(spans), (1,), generator=g))
        u = torch.rand(2, generator=g, dtype=torch.float64).tolist()
        lo, hi = spans[k]
        if mode is DistillMode.TDM:
            top = max(min(hi, T_MAX), lo)  # s < 1 always: the ODE point keeps some signal
            s = lo + u[0] * (top - lo) if random_mid else lo
            bottom = min(max(s, T_MIN), hi)
            ceiling = top if intervals is Intervals.DISJOINT else max(T_MAX, top)
            tau = bottom + u[1] * (max(ceiling, bottom) - bottom)
        else:
            s, tau = 0.0, T_MIN + u[1] * (T_MAX - T_MIN)
        ks.append(k)
        t_in.append(hi)
        t_mid.append(s)
        t_query.append(tau)
        noises.append(torch.randn(shape, generator=g, dtype=torch.float32))
    return StagePoints(
        torch.tensor(ks, dtype=torch.long),
        torch.tensor(t_in, dtype=torch.float32),
        torch.tensor(t_mid, dtype=torch.float32),
        torch.tensor(t_query, dtype=torch.float32),
        torch.stack(noises),
    )


def _col(t: Tensor, like: Tensor) -> Tensor:
    return t.to(like.device, like.dtype).view(-1, *[1] * (like.dim() - 1))


def renoise(
    x0: Tensor, eps: Tensor, t_mid: Tensor, t_query: Tensor, noise: Tensor
) -> tuple[Tensor, Tensor]:
    """x̂0 [B, C, H, W] moved along the ODE with the noise estimate ``eps`` to
    x_s = (1 − s)·x̂0 + s·ε̂, then forward-noised with fresh ``noise`` to τ:
    x_τ = a·x_s + b·n, a = (1 − τ)/(1 − s), b = √(τ² − (a·s)²) (τ ≥ s, s < 1), which
    keeps x̂0's coefficient 1 − τ and a unit-variance noise's total std τ. Returns x_τ and
    the mixed noise m [B, C, H, W] with x_τ = (1 − τ)·x̂0 + τ·m. s = 0 is plain DMD noising."""
    s, tau = _col(t_mid, x0), _col(t_query, x0)
    a = (1 - tau) / (1 - s)
    b = (tau.square() - (a * s).square()).clamp_min(0).sqrt()
    x_mid = (1 - s) * x0 + s * eps
    x_tau = a * x_mid + b * noise
    mixed = (a * s * eps + b * noise) / tau
    return x_tau, mixed


Velocity = Callable[[Tensor, Tensor], Tensor]


@torch.no_grad()
def rollout_inputs(velocity: Velocity, noise: Tensor, times: Tensor) -> list[Tensor]:
    """The inputs of the student's K steps, [x at times[0] (the noise), …, x at
    times[K − 1]], each float32 [B, C, H, W], by K − 1 Euler steps of ``velocity(x, t)``
    (krea2's sampler step: the state in float32, the model in its own dtype)."""
    from krea2.dit.sampler import euler_step

    states = [noise.float()]
    for k in range(len(times) - 2):
        nxt = euler_step(velocity, states[-1], float(times[k]), float(times[k + 1]), noise.dtype)
        states.append(nxt)
    return states


def pick_inputs(states: list[Tensor], stage: Tensor) -> Tensor:
    """Row i of ``states[stage[i]]`` for every sample: [B, C, H, W]."""
    rows = torch.arange(stage.numel())
    return torch.stack(states)[stage, rows]
