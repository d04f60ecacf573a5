"""Laplacian-variance filter: extreme textures and noise patterns have huge local contrast."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most


def laplacian_variance(grey: np.ndarray) -> float:
    """Variance of the 3×3 Laplacian of (h, w) uint8 grey, in grey levels²."""
    lap = cv2.Laplacian(grey, cv2.CV_32F)
    _, std = cv2.meanStdDev(lap)
    return float(std[0, 0] ** 2)


def laplacian(grey: np.ndarray, t: StageThresholds) -> FilterResult:
    """Fail above ``max_laplacian_var``. Low variance (blur) is kept on purpose: softness
    can be deliberate, and the report never filters on it."""
    return at_most("laplacian", laplacian_variance(grey), t.max_laplacian_var, "laplacian var")
