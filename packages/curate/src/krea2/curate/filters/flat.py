"""Flat-colour filter: one colour covering (nearly) the whole frame."""

from __future__ import annotations

import numpy as np
from numba import njit

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most
from krea2.curate.filters.entropy import channel_histograms
from krea2.curate.pixel_pass import channel_medians, count_pixels_within, frozen

TOLERANCE = 8  # grey levels per channel around the dominant colour (absorbs JPEG noise)


@njit(cache=True, nogil=True)
def flat_count(px: np.ndarray, hists: np.ndarray) -> int:
    """Pixels of C-contiguous (h, w, 3) uint8 ``px`` within ±TOLERANCE of the per-channel
    median of (3, 256) int64 ``hists`` (numpy's median: a half level between the two middle
    values of an even count)."""
    centre = channel_medians(hists)
    lo = np.empty(3, np.uint8)
    hi = np.empty(3, np.uint8)
    for c in range(3):  # the integer levels within ±TOLERANCE of the centre
        lo[c] = min(max(np.ceil(centre[c] - TOLERANCE), 0), 255)
        hi[c] = min(max(np.floor(centre[c] + TOLERANCE), 0), 255)
    return count_pixels_within(px, lo, hi)


def flat_ratio(pixels: np.ndarray, hists: np.ndarray | None = None) -> float:
    """Share of pixels within ±TOLERANCE of the per-channel median colour. ``hists``: the
    pixels' ``channel_histograms`` if already computed."""
    hists = channel_histograms(pixels) if hists is None else hists
    count = flat_count(frozen(pixels), frozen(hists, np.int64))
    return count / (pixels.shape[0] * pixels.shape[1])


def flat_color(score: float, t: StageThresholds) -> FilterResult:
    """Fail when ``score`` (``flat_ratio``; ``Planes.flat_ratio``) is above
    ``max_flat_ratio``."""
    return at_most("flat_color", score, t.max_flat_ratio, "dominant-colour share")
