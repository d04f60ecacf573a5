"""ShapesEval, our GenEval analogue: the rubric verifier averaged over held-out prompts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from krea2.curate.shapes.spec import Scene
from krea2.curate.shapes.verify import verify

if TYPE_CHECKING:
    from krea2.curate.ocr import OcrEngine


@dataclass(frozen=True)
class ShapesEvalScore:
    """``score``: the mean verifier score over every image (ShapesEval); ``by_kind``: the mean
    pass rate per requirement kind (object, position, count, total, word); ``all_correct``:
    the share of images that pass every requirement; ``per_image[p][s]``: the score of
    prompt p's s-th image."""

    score: float
    by_kind: dict[str, float]
    all_correct: float
    per_image: list[list[float]]


def shapes_eval(
    images: np.ndarray | Sequence[Sequence[np.ndarray]],
    targets: Sequence[Scene | str],
    *,
    ocr: OcrEngine | None = None,
) -> ShapesEvalScore:
    """Score images [P, S, H, W, 3] uint8 RGB (S images of each of P prompts) against their
    ``targets``: each a prompt (parsed into requirements) or the scene spec it was written
    from (every requirement the scene implies). ``ocr`` reads words (see ``verify``)."""
    if len(images) != len(targets):
        raise ValueError(f"{len(images)} rows of images for {len(targets)} targets")
    scores: list[float] = []
    kinds: dict[str, list[float]] = {}
    per_image: list[list[float]] = []
    for target, row in zip(targets, images, strict=True):
        per_image.append([])
        for image in row:
            v = verify(target, image, ocr=ocr)
            scores.append(v.score)
            per_image[-1].append(v.score)
            for kind, value in v.by_kind().items():
                kinds.setdefault(kind, []).append(value)
    return ShapesEvalScore(
        score=float(np.mean(scores)),
        by_kind={k: float(np.mean(v)) for k, v in sorted(kinds.items())},
        all_correct=float(np.mean([s == 1.0 for s in scores])),
        per_image=per_image,
    )
