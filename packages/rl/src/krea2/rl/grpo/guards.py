"""Guards against reward hacking: the artifact reward as a gate on the other rewards, and
early stopping when the held-out artifact reward falls past a bound (the objective,
:class:`krea2.rl.grpo.objective.GrpoObjective`, calls :func:`artifact_alarm` on every
evaluation)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

ARTIFACT = "artifact"


def gate_rewards(rewards: Mapping[str, np.ndarray], gate: float) -> dict[str, np.ndarray]:
    """Rewards name → [P, G] with every non-artifact reward of an image whose ``artifact``
    reward (1 - P(defect)) is below ``gate`` set to its group's minimum of that reward: a
    defective image can never be the group's best, so a defect that happens to satisfy the
    rubric earns nothing. The artifact reward itself is kept as it is."""
    if ARTIFACT not in rewards:
        raise ValueError(f"the artifact gate needs a reward named {ARTIFACT!r}")
    bad = np.asarray(rewards[ARTIFACT]) < gate
    out: dict[str, np.ndarray] = {}
    for name, values in rewards.items():
        v = np.asarray(values, np.float64)
        if name == ARTIFACT or not bad.any():
            out[name] = v
            continue
        floor = v.min(1, keepdims=True)
        out[name] = np.where(bad, np.broadcast_to(floor, v.shape), v)
    return out


def artifact_alarm(first: float, current: float, bound: float) -> str | None:
    """Why to stop, or None: the held-out artifact reward (1 - P(defect)) fell below
    ``(1 - bound)`` x its first value (``bound`` = 0.5: lost half). Relative, so it works
    whatever the head's scale on the model's samples (a head trained on renders may score
    a toy model's clean samples near 0.02, where an absolute bound can never fire)."""
    if not 0 < bound < 1:
        raise ValueError(f"artifact_bound={bound} must be in (0, 1): the share that may be lost")
    floor = (1.0 - bound) * first
    if current < floor:
        return (
            f"the held-out artifact reward fell from {first:.4f} to {current:.4f}, below "
            f"(1 - artifact_bound={bound}) x its first value"
        )
    return None
