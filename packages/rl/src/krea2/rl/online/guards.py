"""Guards against reward hacking: the artifact reward as a gate on the other rewards, early
stopping when the held-out artifact reward falls past a bound, and a reward-free artifact
measure, :func:`background_noise` (the fine grid pattern RL on ShapesWorld produced), with
its own bound (the objective, :class:`krea2.rl.online.objective.GrpoObjective`, calls
:func:`artifact_alarm` and :func:`noise_alarm` on every evaluation)."""

from __future__ import annotations

from collections.abc import Mapping

import cv2
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


def background_noise(images: np.ndarray, tolerance: float = 24.0) -> np.ndarray:
    """Per image of uint8 [B, H, W, 3]: the mean absolute high-pass (grey value minus its
    3x3 mean, in 0..255 grey levels) over the background, where the background colour is
    the median of the border pixels and a pixel belongs to it when its 5x5 mean is within
    ``tolerance`` of that colour in every channel. A ShapesWorld image's background is one
    plain colour, so this is ~0.5 for the demo's pretrained samples and ~9 for samples
    with the grid pattern reward hacking laid over the background (docs/rl.md); no reward
    sees it. float64 [B] (0 for an image without background pixels)."""
    x = np.asarray(images)
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"images must be [B, H, W, 3], got shape {x.shape}")
    out = np.zeros(x.shape[0], np.float64)
    for i, image in enumerate(x):
        f = image.astype(np.float32)
        border = np.concatenate([f[0], f[-1], f[:, 0], f[:, -1]])
        mask = np.abs(cv2.blur(f, (5, 5)) - np.median(border, 0)).max(2) < tolerance
        gray = f.mean(2)
        high = np.abs(gray - cv2.blur(gray, (3, 3)))
        out[i] = float(high[mask].mean()) if mask.any() else 0.0
    return out


def noise_alarm(first: float, current: float, bound: float) -> str | None:
    """Why to stop, or None: the held-out :func:`background_noise` rose above ``bound`` x
    its first value (``bound`` > 1; the demo's 2.0: twice the pretrained model's)."""
    if not bound > 1:
        raise ValueError(f"noise_bound={bound} must be > 1: the factor the noise may grow by")
    if current > bound * first:
        return (
            f"the held-out background noise rose from {first:.3f} to {current:.3f}, above "
            f"noise_bound={bound} x its first value"
        )
    return None
