"""RGB-entropy filter: near-constant images carry almost no information."""

from __future__ import annotations

import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_least
from krea2.curate.pixel_pass import frozen
from krea2.curate.planes import planes
from krea2.curate.score_kernels import entropy_bits


def channel_histograms(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB → (3, 256) int64 pixel counts per channel level (shared by the
    entropy and flat-colour filters; ``Planes.hists``)."""
    return planes(pixels).hists


def rgb_entropy(pixels: np.ndarray, hists: np.ndarray | None = None) -> float:
    """Mean over R, G, B of the Shannon entropy of the 256-bin histogram, in bits (0..8).
    ``hists``: the pixels' ``channel_histograms`` if already computed."""
    hists = channel_histograms(pixels) if hists is None else hists
    return float(entropy_bits(frozen(hists, np.int64)))


def entropy(score: float, t: StageThresholds) -> FilterResult:
    """Fail when ``score`` (``rgb_entropy``; ``Planes.entropy``) is below ``min_entropy``
    bits."""
    return at_least("entropy", score, t.min_entropy, "RGB entropy bits")
