"""Guards against reward hacking: the artifact reward as a gate on the other rewards.

(The other guard, early stopping when the held-out artifact reward falls past a bound, is
in the objective: :class:`krea2.rl.grpo.objective.GrpoObjective`.)
"""

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
