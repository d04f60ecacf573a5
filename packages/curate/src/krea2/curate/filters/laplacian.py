"""Laplacian-variance filter: extreme textures and noise patterns have huge local contrast."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most

TILES = 8  # the image is cut into TILES × TILES tiles


def laplacian_variance(grey: np.ndarray) -> float:
    """Median over an 8×8 grid of tiles of the 3×3 Laplacian's variance, in grey levels².

    The median, not the global variance: an extreme texture or noise pattern covers the
    whole frame, while a photo with one detailed region or a block of text does not.
    """
    lap = cv2.Laplacian(grey, cv2.CV_32F)
    h, w = lap.shape
    th, tw = h // TILES, w // TILES
    if th < 2 or tw < 2:
        return float(lap.var())
    tiles = lap[: th * TILES, : tw * TILES].reshape(TILES, th, TILES, tw)
    mean = tiles.mean(axis=(1, 3))
    var = (tiles * tiles).mean(axis=(1, 3)) - mean * mean
    return float(np.median(var))


def laplacian(grey: np.ndarray, t: StageThresholds) -> FilterResult:
    """Fail above ``max_laplacian_var``. Low variance (blur) is kept on purpose: softness
    can be deliberate, and the report never filters on it."""
    return at_most("laplacian", laplacian_variance(grey), t.max_laplacian_var, "laplacian var")
