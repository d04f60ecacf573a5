"""RGB-entropy filter: near-constant images carry almost no information."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_least


def rgb_entropy(pixels: np.ndarray) -> float:
    """Mean over R, G, B of the Shannon entropy of the 256-bin histogram, in bits (0..8)."""
    total = 0.0
    n = pixels.shape[0] * pixels.shape[1]
    for c in range(3):
        hist = cv2.calcHist([pixels], [c], None, [256], [0, 256]).ravel()
        p = hist[hist > 0] / n
        total += float(-(p * np.log2(p)).sum())
    return total / 3


def entropy(pixels: np.ndarray, t: StageThresholds) -> FilterResult:
    """Fail below ``min_entropy`` bits."""
    return at_least("entropy", rgb_entropy(pixels), t.min_entropy, "RGB entropy bits")
