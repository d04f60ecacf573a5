"""Flat-colour filter: one colour covering (nearly) the whole frame."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most

TOLERANCE = 8  # grey levels per channel around the dominant colour (absorbs JPEG noise)


def flat_ratio(pixels: np.ndarray) -> float:
    """Share of pixels within ±TOLERANCE of the per-channel median colour."""
    # The median of a subsample is enough to find the dominant colour of a flat image.
    sample = pixels[::4, ::4].reshape(-1, 3)
    centre = np.median(sample, axis=0)
    lo = tuple(float(max(0, c - TOLERANCE)) for c in centre)
    hi = tuple(float(min(255, c + TOLERANCE)) for c in centre)
    mask = cv2.inRange(pixels, lo, hi)
    return cv2.countNonZero(mask) / mask.size


def flat_color(pixels: np.ndarray, t: StageThresholds) -> FilterResult:
    return at_most("flat_color", flat_ratio(pixels), t.max_flat_ratio, "dominant-colour share")
