"""The artifact/structure reward: a classifier head that flags structural defects.

Trained on ShapesWorld renders with injected defects (noise, blur, broken shapes, borders);
it is the guard against reward hacking (an image that games the rubric with noise or a
frame scores low here). Score = 1 − P(defect).

A head trained on renders alone scores a small generator's own clean samples as defects
(the demo's 64 px DiT: ~0.03), where neither a reward nor a guard can work:
:func:`calibrate_artifact_reward` retrains it with the generator's samples as the clean
class and defects injected into those samples (noise, blur, borders and the fine grid
pattern RL produced on ShapesWorld, :func:`grid_defect`) as the defective one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from krea2.curate import shapes
from krea2.rl.rewards.contract import RewardOutput
from krea2.rl.rewards.features import FEATURE_NAMES, image_features
from krea2.rl.rewards.head import HeadReward, fit_classifier

ARTIFACT_DEFECTS: tuple[str, ...] = ("noise", "blur", "broken_shape", "border")


def _noise(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    sigma = rng.uniform(8, 35)
    return np.clip(img + rng.normal(0, sigma, img.shape), 0, 255).astype(np.uint8)


def _blur(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    sigma = rng.uniform(0.9, 2.2) * min(img.shape[:2]) / 64
    return cv2.GaussianBlur(img, (0, 0), sigma)


# The pool's border colours with a near-black one: generators draw dark frames too.
_BORDER_COLOURS = ((255, 255, 255), (200, 200, 200), (128, 128, 128), (20, 20, 20))


def _border(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return shapes.add_border(img, rng, _BORDER_COLOURS)


def _broken(scene: shapes.Scene, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Cut a band out of one object (refilled with the background) and tear it: the half
    beyond the cut is shifted sideways, as a generator's broken geometry looks."""
    h, w = img.shape[:2]
    empty = replace(scene, objects=(), word=None)
    background = shapes.render(empty, w, h)
    obj = scene.objects[rng.integers(len(scene.objects))]
    alone = shapes.render(replace(empty, objects=(obj,)), w, h)
    mask = np.abs(alone.astype(np.int16) - background).max(axis=2) > 24
    ys, xs = np.nonzero(mask)
    if len(ys) < 4:
        return _noise(img, rng)
    cy, cx = ys.mean(), xs.mean()
    extent = max(np.ptp(ys), np.ptp(xs)) + 1
    angle = rng.uniform(0, np.pi)
    yy, xx = np.mgrid[:h, :w]
    along = (yy - cy) * np.sin(angle) + (xx - cx) * np.cos(angle)
    along = along + rng.uniform(-0.2, 0.2) * extent
    band = np.abs(along) < rng.uniform(0.08, 0.18) * extent
    far = mask & (along > 0) & ~band
    out = img.copy()
    out[mask & band] = background[mask & band]
    out[far] = background[far]  # the far piece moves: first erase it ...
    shift = rng.uniform(0.15, 0.3) * extent * (1 if rng.random() < 0.5 else -1)
    dy, dx = round(float(shift * np.cos(angle))), round(float(-shift * np.sin(angle)))
    moved = np.roll(far, (dy, dx), axis=(0, 1))
    out[moved] = np.roll(alone, (dy, dx), axis=(0, 1))[moved]  # ... then redraw it shifted
    return out


def grid_defect(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A fine periodic pattern over the whole image (lines every 2-4 pixels in both
    directions, each channel ±6-30 grey levels): what reward hacking laid over the
    background of a ShapesWorld model's samples under DiffusionNFT at lr 3e-4."""
    h, w = img.shape[:2]
    period = int(rng.integers(2, 5))
    yy, xx = np.mgrid[:h, :w]
    lines = ((yy % period == 0) | (xx % period == 0)).astype(np.float64)
    amp = rng.uniform(6, 30) * rng.choice([-1.0, 1.0], size=3)
    out = img.astype(np.float64) + lines[..., None] * amp
    return np.clip(out, 0, 255).astype(np.uint8)


def render_defects(
    n: int, seed: int = 0, sizes: Sequence[int] = (48, 64, 96)
) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """``n`` ShapesWorld renders, half clean and half with one defect each (the kinds of
    :data:`ARTIFACT_DEFECTS` in turn). Returns (images as uint8 ``[H, W, 3]``, labels ``[n]``
    with 1 = defect, the kind of each image: ``clean`` or a defect name)."""
    rng = np.random.default_rng(seed)
    images, labels, kinds = [], [], []
    for i in range(n):
        scene = shapes.sample_scene(rng)
        side = int(sizes[rng.integers(len(sizes))])
        img = shapes.render(scene, side, side)
        kind = "clean" if i % 2 == 0 else ARTIFACT_DEFECTS[(i // 2) % len(ARTIFACT_DEFECTS)]
        if kind == "noise":
            img = _noise(img, rng)
        elif kind == "blur":
            img = _blur(img, rng)
        elif kind == "border":
            img = _border(img, rng)
        elif kind == "broken_shape":
            img = _broken(scene, img, rng)
        images.append(img)
        labels.append(int(kind != "clean"))
        kinds.append(kind)
    return images, np.asarray(labels, np.int64), kinds


def _features(images: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([image_features(img[None]) for img in images])


class ArtifactReward(HeadReward):
    """Score = 1 − P(defect) in [0, 1] from an :class:`MlpHead` over
    :func:`~krea2.rl.rewards.features.image_features`; sub-score ``p_defect``. Prompts are
    checked but not used."""

    name = "artifact"
    sub_scores = ("p_defect",)

    def from_logits(self, logits: np.ndarray) -> RewardOutput:
        p = 1.0 / (1.0 + np.exp(-logits))
        return RewardOutput(1.0 - p, {"p_defect": p})


@dataclass(frozen=True)
class DetectionReport:
    """Held-out defect detection: ``auc`` (defect vs clean), ``accuracy`` at P = 0.5, the
    detection rate per defect kind, and the mean score of clean and defective images."""

    auc: float
    accuracy: float
    recall_by_kind: dict[str, float]
    clean_score: float
    defect_score: float


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (ties count half)."""
    labels, scores = np.asarray(labels).astype(bool), np.asarray(scores, np.float64)
    pos, neg = scores[labels], scores[~labels]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / max(1, pos.size * neg.size))


def evaluate_artifact_reward(
    reward: ArtifactReward, n: int = 400, seed: int = 1
) -> DetectionReport:
    """Detection quality on ``n`` fresh renders from ``seed`` (held out from training)."""
    images, labels, kinds = render_defects(n, seed)
    scores = np.concatenate([reward(img[None], ["x"]).scores for img in images])
    p = 1.0 - scores
    kinds_arr = np.asarray(kinds)
    recall = {k: float((p[kinds_arr == k] > 0.5).mean()) for k in ARTIFACT_DEFECTS}
    return DetectionReport(
        auc=roc_auc(labels, p),
        accuracy=float(((p > 0.5) == labels.astype(bool)).mean()),
        recall_by_kind=recall,
        clean_score=float(scores[labels == 0].mean()),
        defect_score=float(scores[labels == 1].mean()),
    )


def calibrate_artifact_reward(
    samples: Any,
    n: int = 400,
    seed: int = 0,
    path: str | Path | None = None,
    epochs: int = 200,
) -> ArtifactReward:
    """The head trained on ``n`` renders of :func:`render_defects` plus a generator's own
    samples (uint8 ``[B, H, W, 3]``) as clean images, each also copied once with one
    injected defect (noise, blur, border, :func:`grid_defect` in turn) as a defective one;
    ``n`` // 4 renders also get the grid as a defect. Saved to ``path`` when given."""
    images, labels, _ = render_defects(n, seed)
    rng = np.random.default_rng(seed + 1)
    model = list(np.asarray(samples, np.uint8))
    if not model:
        raise ValueError("calibrate_artifact_reward needs at least one sample")
    defects = (_noise, _blur, _border, grid_defect)
    bad = [defects[i % len(defects)](img, rng) for i, img in enumerate(model)]
    grid_renders = [grid_defect(img, rng) for img in images[: n // 4]]
    x = _features([*images, *model, *bad, *grid_renders])
    y = np.concatenate([labels, np.zeros(len(model), np.int64), np.ones(len(bad), np.int64),
                        np.ones(len(grid_renders), np.int64)])  # fmt: skip
    meta = {"kind": "artifact", "features": list(FEATURE_NAMES), "n": n, "seed": seed,
            "calibrated_on": len(model)}  # fmt: skip
    head = fit_classifier(x, y, epochs=epochs, seed=seed, meta=meta)
    return ArtifactReward.fitted(head, path)


def train_artifact_reward(
    n: int = 1200, seed: int = 0, path: str | Path | None = None, epochs: int = 400
) -> ArtifactReward:
    """Train the head on ``n`` renders of :func:`render_defects` (half clean) and save it
    to ``path`` when given."""
    images, labels, _ = render_defects(n, seed)
    head = fit_classifier(
        _features(images),
        labels,
        epochs=epochs,
        seed=seed,
        meta={"kind": "artifact", "features": list(FEATURE_NAMES), "n": n, "seed": seed},
    )
    return ArtifactReward.fitted(head, path)
