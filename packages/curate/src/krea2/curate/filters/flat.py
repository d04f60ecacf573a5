"""Flat-colour filter: one colour covering (nearly) the whole frame."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most
from krea2.curate.filters.entropy import channel_histograms

TOLERANCE = 8  # grey levels per channel around the dominant colour (absorbs JPEG noise)


def median_colour(hists: np.ndarray) -> np.ndarray:
    """Per-channel median (numpy's: mean of the two middle values) from (3, 256) counts."""
    cum = np.cumsum(hists, axis=1)
    n = int(cum[0, -1])
    middle = [(n - 1) // 2, n // 2]  # ranks of the two middle values
    return np.array([np.searchsorted(c, middle, side="right").mean() for c in cum])


def flat_ratio(pixels: np.ndarray, hists: np.ndarray | None = None) -> float:
    """Share of pixels within ±TOLERANCE of the per-channel median colour. ``hists``: the
    pixels' ``channel_histograms`` if already computed."""
    centre = median_colour(channel_histograms(pixels) if hists is None else hists)
    lo = tuple(float(max(0, c - TOLERANCE)) for c in centre)
    hi = tuple(float(min(255, c + TOLERANCE)) for c in centre)
    mask = cv2.inRange(pixels, lo, hi)
    return cv2.countNonZero(mask) / mask.size


def flat_color(
    pixels: np.ndarray, t: StageThresholds, hists: np.ndarray | None = None
) -> FilterResult:
    score = flat_ratio(pixels, hists)
    return at_most("flat_color", score, t.max_flat_ratio, "dominant-colour share")
