"""Flat-colour filter: one colour covering (nearly) the whole frame."""

from __future__ import annotations

import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most
from krea2.curate.filters.entropy import channel_histograms
from krea2.curate.pixel_pass import frozen
from krea2.curate.score_kernels import flat_count


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
