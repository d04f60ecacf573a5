"""Flat-colour filter: one colour covering (nearly) the whole frame."""

from __future__ import annotations

import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most
from krea2.curate.filters.entropy import channel_histograms
from krea2.curate.pixel_pass import channel_medians, count_within, frozen

TOLERANCE = 8  # grey levels per channel around the dominant colour (absorbs JPEG noise)


def flat_ratio(pixels: np.ndarray, hists: np.ndarray | None = None) -> float:
    """Share of pixels within ±TOLERANCE of the per-channel median colour. ``hists``: the
    pixels' ``channel_histograms`` if already computed."""
    hists = channel_histograms(pixels) if hists is None else hists
    centre = channel_medians(frozen(hists, np.int64))
    # Integer levels within ±TOLERANCE of a centre that may be a half level.
    lo = np.clip(np.ceil(centre - TOLERANCE), 0, 255)
    hi = np.clip(np.floor(centre + TOLERANCE), 0, 255)
    return count_within(pixels, lo, hi) / (pixels.shape[0] * pixels.shape[1])


def flat_color(
    pixels: np.ndarray, t: StageThresholds, hists: np.ndarray | None = None
) -> FilterResult:
    score = flat_ratio(pixels, hists)
    return at_most("flat_color", score, t.max_flat_ratio, "dominant-colour share")
