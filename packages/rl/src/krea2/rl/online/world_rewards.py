"""The ShapesWorld reward set of the RL stage and the expander's GDPO: the rubric verifier,
the dense shape fidelity and the artifact head (trained or calibrated once, then loaded)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np


def shapes_rewards(
    work: Path,
    samples: Callable[[], np.ndarray] | None = None,
    shape_whole: bool = False,
) -> dict:
    """The ShapesWorld rewards: ``rubric`` (the verifier, no OCR), ``shape`` (the dense
    shape fidelity, :class:`krea2.rl.rewards.ShapeFidelityReward`, its ``whole`` term with
    ``shape_whole``) and ``artifact`` (its head trained once, ~10 s: on renders into
    ``work/artifact.npz``, or with ``samples``, a callable returning the model's own
    samples uint8 [B, H, W, 3], calibrated on them,
    :func:`krea2.rl.rewards.calibrate_artifact_reward`, into
    ``work/artifact-calibrated.npz``)."""
    from krea2.rl.rewards import (
        ArtifactReward,
        ShapeFidelityReward,
        ShapesRubricReward,
        calibrate_artifact_reward,
        train_artifact_reward,
    )

    path = Path(work) / ("artifact.npz" if samples is None else "artifact-calibrated.npz")
    if path.exists():
        artifact = ArtifactReward.load(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        if samples is None:
            artifact = train_artifact_reward(n=400, seed=0, path=path, epochs=200)
        else:
            artifact = calibrate_artifact_reward(samples(), n=400, seed=0, path=path, epochs=200)
    return {
        "rubric": ShapesRubricReward(ocr=False),
        "shape": ShapeFidelityReward(whole=shape_whole),
        "artifact": artifact,
    }
