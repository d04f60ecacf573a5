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
    crop = lap[: th * TILES, : tw * TILES]
    mean = _tile_sums(crop, th, tw) / (th * tw)
    var = _tile_sums(cv2.multiply(crop, crop), th, tw) / (th * tw) - mean * mean
    return float(np.median(var))


def _tile_sums(x: np.ndarray, th: int, tw: int) -> np.ndarray:
    """(TILES·th, TILES·tw) → (TILES, TILES) sums: rows of each tile band first (contiguous
    adds), then columns; several times faster than one reduction over two strided axes."""
    return x.reshape(TILES, th, TILES * tw).sum(axis=1).reshape(TILES, TILES, tw).sum(axis=2)


def laplacian(grey: np.ndarray, t: StageThresholds) -> FilterResult:
    """Fail above ``max_laplacian_var``. Low variance (blur) is kept on purpose: softness
    can be deliberate, and the report never filters on it."""
    return at_most("laplacian", laplacian_variance(grey), t.max_laplacian_var, "laplacian var")
