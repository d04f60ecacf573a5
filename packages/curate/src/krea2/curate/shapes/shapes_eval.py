"""ShapesEval, our GenEval analogue: the rubric verifier averaged over held-out prompts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from krea2.curate.shapes.detect import UNCLEAR_MARGIN
from krea2.curate.shapes.spec import Scene
from krea2.curate.shapes.verify import verify

if TYPE_CHECKING:
    from krea2.curate.ocr import OcrEngine


@dataclass(frozen=True)
class ShapesEvalScore:
    """``score``: the mean verifier score over every image (ShapesEval); ``by_kind``: the mean
    pass rate per requirement kind (object, position, count, total, word); ``all_correct``:
    the share of images that pass every requirement; ``per_image[p][s]``: the score of
    prompt p's s-th image.

    An object whose shape is unclear (``detect.UNCLEAR_MARGIN``) fails every requirement
    naming a shape; ``unclear_rate`` is the share of detected objects that were unclear.
    The ``*_forced`` fields are the same measures with the old forced choice (each object
    read as its best shape), kept beside the new ones for one release."""

    score: float
    by_kind: dict[str, float]
    all_correct: float
    per_image: list[list[float]]
    score_forced: float | None = None
    by_kind_forced: dict[str, float] | None = None
    all_correct_forced: float | None = None
    per_image_forced: list[list[float]] | None = None
    unclear_rate: float = 0.0
    unclear_margin: float = 0.0


def _mean_by_kind(rows: list[dict[str, float]]) -> dict[str, float]:
    kinds: dict[str, list[float]] = {}
    for row in rows:
        for kind, value in row.items():
            kinds.setdefault(kind, []).append(value)
    return {k: float(np.mean(v)) for k, v in sorted(kinds.items())}


def shapes_eval(
    images: np.ndarray | Sequence[Sequence[np.ndarray]],
    targets: Sequence[Scene | str],
    *,
    ocr: OcrEngine | None = None,
    unclear_margin: float = UNCLEAR_MARGIN,
) -> ShapesEvalScore:
    """Score images [P, S, H, W, 3] uint8 RGB (S images of each of P prompts) against their
    ``targets``: each a prompt (parsed into requirements) or the scene spec it was written
    from (every requirement the scene implies). ``ocr`` reads words (see ``verify``);
    ``unclear_margin=0`` gives the forced-choice score alone."""
    if len(images) != len(targets):
        raise ValueError(f"{len(images)} rows of images for {len(targets)} targets")
    per_image: list[list[float]] = []
    per_image_forced: list[list[float]] = []
    kinds: list[dict[str, float]] = []
    kinds_forced: list[dict[str, float]] = []
    n_objects = n_unclear = 0
    for target, row in zip(targets, images, strict=True):
        per_image.append([])
        per_image_forced.append([])
        for image in row:
            v = verify(target, image, ocr=ocr, unclear_margin=unclear_margin)
            per_image[-1].append(v.score)
            per_image_forced[-1].append(v.score_forced)
            kinds.append(v.by_kind())
            kinds_forced.append(v.by_kind_forced())
            n_objects += len(v.objects)
            n_unclear += len(v.unclear)
    scores = [s for row in per_image for s in row]
    forced = [s for row in per_image_forced for s in row]
    return ShapesEvalScore(
        score=float(np.mean(scores)),
        by_kind=_mean_by_kind(kinds),
        all_correct=float(np.mean([s == 1.0 for s in scores])),
        per_image=per_image,
        score_forced=float(np.mean(forced)),
        by_kind_forced=_mean_by_kind(kinds_forced),
        all_correct_forced=float(np.mean([s == 1.0 for s in forced])),
        per_image_forced=per_image_forced,
        unclear_rate=n_unclear / n_objects if n_objects else 0.0,
        unclear_margin=unclear_margin,
    )
