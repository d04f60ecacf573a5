"""Composing rewards: a weighted sum, and per-group normalization for GRPO/GDPO."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from krea2.rl.rewards.contract import Reward, RewardOutput, check_batch


class WeightedSum:
    """A :class:`Reward` scoring ``sum(weight * part.score)``.

    ``parts``: name → ``(reward, weight)``. Sub-scores: each part's score under its name, and
    each part's own sub-scores as ``name/sub``. Parts see the same uint8 batch.
    """

    def __init__(self, parts: Mapping[str, tuple[Reward, float]], name: str = "weighted") -> None:
        if not parts:
            raise ValueError("WeightedSum needs at least one (reward, weight) part")
        for key in parts:
            if "/" in key:
                raise ValueError(f"part name {key!r} must not contain '/' (it joins sub-scores)")
        self.parts = dict(parts)
        self.name = name

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        total = np.zeros(pixels.shape[0], np.float32)
        subs: dict[str, np.ndarray] = {}
        for key, (reward, weight) in self.parts.items():
            out = reward(pixels, prompts)
            total += np.float32(weight) * out.scores
            subs[key] = out.scores
            subs.update({f"{key}/{k}": v for k, v in out.sub_scores.items()})
        return RewardOutput(total, subs)


def group_z(values: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Per-row z-score of values [P, G] (one row per prompt's group); rows whose std is
    below ``eps`` are 0. float64 [P, G]."""
    v = np.asarray(values, np.float64)
    if v.ndim != 2:
        raise ValueError(f"values must be [prompts, group], got shape {v.shape}")
    mean = v.mean(1, keepdims=True)
    std = v.std(1, keepdims=True)
    return np.where(std >= eps, (v - mean) / np.maximum(std, eps), 0.0)


def group_normalize(scores: np.ndarray, groups: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Per-group z-score of ``scores`` ``[B]``: ``(s - mean_g) / std_g`` within each group id
    of ``groups`` ``[B]`` (e.g. the prompt index of each GRPO rollout). A group whose std is
    below ``eps`` (all equal, or one member) gets 0. Returns ``[B]`` float32."""
    scores = np.asarray(scores, np.float64).reshape(-1)
    groups = np.asarray(groups).reshape(-1)
    if scores.shape != groups.shape:
        raise ValueError(f"scores has {scores.shape[0]} values but groups has {groups.shape[0]}")
    out = np.zeros_like(scores)
    _, inverse = np.unique(groups, return_inverse=True)
    for g in range(int(inverse.max()) + 1 if inverse.size else 0):
        members = inverse == g
        out[members] = group_z(scores[members][None, :], eps)[0]
    return out.astype(np.float32)
