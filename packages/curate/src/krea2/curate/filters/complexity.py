"""Image-complexity filter: scenes too busy to model at the stage's resolution."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most


def edge_density(grey: np.ndarray) -> float:
    """Share of (h, w) uint8 grey pixels that are Canny edges (thresholds 100/200)."""
    edges = cv2.Canny(grey, 100, 200)
    return cv2.countNonZero(edges) / edges.size


def complexity(grey: np.ndarray, t: StageThresholds) -> FilterResult:
    return at_most("complexity", edge_density(grey), t.max_complexity, "edge density")
