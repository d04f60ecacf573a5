"""Advantages from several rewards over groups of G rollouts per prompt.

Two aggregations (``Aggregation``, named as trl's ``multi_objective_aggregation``):

* ``sum_then_normalize`` (older name ``sum``): the weighted sum of the rewards, then
  normalized within each prompt's group (GRPO's advantage; an easy reward with a large
  spread drowns a hard one);
* ``normalize_then_sum`` (older name ``gdpo``): each reward normalized within its group
  first, the weighted sum of those, then normalized over the whole batch (GDPO), so every
  reward's ranking counts by its weight whatever its scale or spread.

A group whose value has (near) zero spread gets advantage 0 for it: nothing to learn.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import numpy as np

from krea2.rl.rewards.compose import group_z

EPS = 1e-6


class Aggregation(StrEnum):
    SUM_THEN_NORMALIZE = "sum_then_normalize"  # GRPO's
    NORMALIZE_THEN_SUM = "normalize_then_sum"  # GDPO's

    @classmethod
    def _missing_(cls, value: object) -> Aggregation | None:
        """The older names: ``sum`` and ``gdpo``."""
        return {"sum": cls.SUM_THEN_NORMALIZE, "gdpo": cls.NORMALIZE_THEN_SUM}.get(str(value))


def batch_moments(values: np.ndarray) -> tuple[float, float, float]:
    """(count, sum, sum of squares) of values: what ranks all-reduce for a batch z-score."""
    v = np.asarray(values, np.float64)
    return float(v.size), float(v.sum()), float((v * v).sum())


def advantages(
    rewards: Mapping[str, np.ndarray],
    weights: Mapping[str, float],
    how: Aggregation | str = Aggregation.NORMALIZE_THEN_SUM,
    moments: tuple[float, float, float] | None = None,
    eps: float = EPS,
) -> np.ndarray:
    """Advantages [P, G] float64 from ``rewards`` (name → [P, G]) and their ``weights``.

    GDPO's batch normalization uses ``moments`` = (count, sum, sum of squares) of the
    weighted sum over the whole batch (all ranks; see :func:`gdpo_sum`), or this batch's
    own when None. KeyError-free: a reward without a weight is a ValueError naming it."""
    missing = sorted(set(rewards) - set(weights))
    if missing:
        raise ValueError(f"rewards {missing} have no weight (weights: {sorted(weights)})")
    how = Aggregation(how)
    if how is Aggregation.SUM_THEN_NORMALIZE:
        return group_z(weighted(rewards, weights), eps)
    s = gdpo_sum(rewards, weights, eps)
    n, total, squares = moments if moments is not None else batch_moments(s)
    mean = total / max(n, 1.0)
    std = float(np.sqrt(max(squares / max(n, 1.0) - mean * mean, 0.0)))
    return (s - mean) / std if std >= eps else np.zeros_like(s)


def weighted(rewards: Mapping[str, np.ndarray], weights: Mapping[str, float]) -> np.ndarray:
    """Σ_k w_k R_k [P, G] float64."""
    return sum(float(weights[k]) * np.asarray(r, np.float64) for k, r in rewards.items())


def gdpo_sum(
    rewards: Mapping[str, np.ndarray], weights: Mapping[str, float], eps: float = EPS
) -> np.ndarray:
    """Σ_k w_k z_group(R_k) [P, G] float64: GDPO before its batch normalization."""
    return sum(float(weights[k]) * group_z(r, eps) for k, r in rewards.items())
