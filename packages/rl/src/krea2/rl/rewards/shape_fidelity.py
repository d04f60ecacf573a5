"""The ShapesWorld shape-fidelity reward: how well the prompt's objects match their shape.

The rubric verifier is pass/fail per requirement: an object counts when its colour
component's best template is the asked shape. A model that draws squares with ragged
corners fails them all alike (every image of a group scores the same, no advantage to
learn from), although some of its squares are much closer than others. This reward is the
verifier's own continuous measure behind that decision: for each colour+shape the prompt
asks for, the soft IoU (:func:`krea2.curate.shapes.detect.classify_shape`) of the best
component of that colour with the shape's template minus its IoU with its best other
shape (the margin: > 0 is where the verifier reads the asked shape), mapped to [0, 1]. A
dense signal for the same property, to weigh beside the rubric (docs/rl.md). Measured on
the demo's pretrained model without CFG: its failed squares sit at margins -0.12..0.00.

``whole=True`` also asks for each object in one piece and nothing else drawn: the score
is multiplied by the share of all detected object pixels that lie in the asked colours'
k largest components (k the objects of that colour the prompt asks for). The best
component alone decides the margin, so a triangle drawn in two pieces, or with a blob of
another colour inside, keeps its margin while the verifier counts an extra shape and
fails the prompt's count; RL-tuned models draw exactly that (docs/rl.md), and the share
is the dense signal against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from krea2.curate import shapes
from krea2.rl.rewards.contract import RewardOutput, check_batch, empty_output

SUB_SCORES: tuple[str, ...] = ("iou", "margin", "whole")


def shape_fidelity_score(prompt: str, image: np.ndarray) -> tuple[float, float]:
    """(score, margin) of one uint8 image [H, W, 3]: the mean over the prompt's distinct
    colour+shape requirements of the best same-colour component's template IoU with the
    asked shape (0 without one), and of that IoU minus the component's best other shape's
    (-1 without one; > 0 means the verifier reads the asked shape). (1, 1) for a prompt
    that asks for no shape."""
    iou, margin, _ = shape_fidelity_terms(prompt, image)
    return iou, margin


def shape_fidelity_terms(prompt: str, image: np.ndarray) -> tuple[float, float, float]:
    """(score, margin) as :func:`shape_fidelity_score`, and the whole-object share: of all
    detected object pixels, the share in each asked colour's k largest components, k the
    number of objects of that colour the prompt asks for (a ``count`` requirement's count,
    else 1 per asked shape); 0 when nothing is detected, (1, 1, 1) for a prompt that asks
    for no shape."""
    requirements = shapes.parse_prompt(prompt)
    wanted = sorted({(r.color, r.shape) for r in requirements if r.color and r.shape})
    if not wanted:
        return 1.0, 1.0, 1.0
    counts = {(r.color, r.shape): r.count for r in requirements if r.kind == "count" and r.count}
    per_colour: dict[str, int] = {}
    for color, shape in wanted:
        per_colour[color] = per_colour.get(color, 0) + counts.get((color, shape), 1)
    objects = shapes.detect_objects(image)
    ious, margins = [], []
    for color, shape in wanted:
        same = [o.shape_scores for o in objects if o.color == color]
        if not same:
            ious.append(0.0)
            margins.append(-1.0)
            continue
        best = max(same, key=lambda s: s[shape])
        ious.append(best[shape])
        margins.append(best[shape] - max(v for k, v in best.items() if k != shape))
    total = sum(o.area for o in objects)
    asked = sum(
        sum(sorted((o.area for o in objects if o.color == color), reverse=True)[:k])
        for color, k in per_colour.items()
    )
    return float(np.mean(ious)), float(np.mean(margins)), asked / total if total else 0.0


class ShapeFidelityReward:
    """Score = (1 + margin) / 2 per image (:func:`shape_fidelity_score`; in [0, 1], 0.5 at
    the verifier's decision), times the whole-object share with ``whole``
    (:func:`shape_fidelity_terms`); sub-scores ``iou``, ``margin`` and ``whole``."""

    name = "shape-fidelity"

    def __init__(self, whole: bool = False) -> None:
        self.whole = whole

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        if not prompts:
            return empty_output(SUB_SCORES)
        terms = [shape_fidelity_terms(p, im) for im, p in zip(pixels, prompts, strict=True)]
        iou, margin, whole = (np.asarray(col, np.float32) for col in zip(*terms, strict=True))
        scores = (1.0 + margin) / 2.0
        if self.whole:
            scores = scores * whole
        return RewardOutput(scores, {"iou": iou, "margin": margin, "whole": whole})
