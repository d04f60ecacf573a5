"""Warmup-stable-decay learning-rate factor, a pure function of the step (stateless on resume)."""

from __future__ import annotations

import math

from krea2.trainer.config import ScheduleConfig, ScheduleDecay


def decay_start(cfg: ScheduleConfig, total_steps: int) -> int:
    """First step of the decay phase (the stable phase is [warmup_steps, decay_start))."""
    return total_steps - round(total_steps * cfg.decay_ratio)


def wsd_factor(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """LR multiplier in [min_lr_factor, 1] at 0-based ``step`` of a ``total_steps`` stage.

    Linear warmup reaches 1 at step ``warmup_steps - 1``; the decay runs from
    ``decay_start`` to the last step and never reaches exactly 0 (a virtual extra step),
    so the last update still moves the weights.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    start = max(decay_start(cfg, total_steps), cfg.warmup_steps)
    if step < start:
        return 1.0
    progress = (step - start + 1) / (total_steps - start + 1)
    if cfg.decay is ScheduleDecay.LINEAR:
        shape = 1.0 - progress
    elif cfg.decay is ScheduleDecay.SQRT:
        shape = 1.0 - math.sqrt(progress)
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_factor + (1.0 - cfg.min_lr_factor) * shape


def in_stable_phase(step: int, total_steps: int, cfg: ScheduleConfig) -> bool:
    """True where the LR is constant at its peak (where PMA checkpoints are taken)."""
    return cfg.warmup_steps <= step < decay_start(cfg, total_steps)
