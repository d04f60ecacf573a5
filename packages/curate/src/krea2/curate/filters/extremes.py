"""White- and black-pixel ratio filters: blown-out or blank frames, flat white/black canvases."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most


def white_ratio(pixels: np.ndarray) -> float:
    """Share of pixels whose three channels are all ≥ 250."""
    mask = cv2.inRange(pixels, (250, 250, 250), (255, 255, 255))
    return cv2.countNonZero(mask) / mask.size


def black_ratio(pixels: np.ndarray) -> float:
    """Share of pixels whose three channels are all ≤ 5."""
    mask = cv2.inRange(pixels, (0, 0, 0), (5, 5, 5))
    return cv2.countNonZero(mask) / mask.size


def white(pixels: np.ndarray, t: StageThresholds, ratio: float | None = None) -> FilterResult:
    """``ratio``: the pixels' ``white_ratio`` if already known (from the colour lookup)."""
    ratio = white_ratio(pixels) if ratio is None else ratio
    return at_most("white_ratio", ratio, t.max_white_ratio, "white pixel share")


def black(pixels: np.ndarray, t: StageThresholds, ratio: float | None = None) -> FilterResult:
    """``ratio``: the pixels' ``black_ratio`` if already known (from the colour lookup)."""
    ratio = black_ratio(pixels) if ratio is None else ratio
    return at_most("black_ratio", ratio, t.max_black_ratio, "black pixel share")
