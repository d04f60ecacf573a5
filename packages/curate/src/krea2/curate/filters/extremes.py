"""White- and black-pixel ratio filters: blown-out or blank frames, flat white/black canvases."""

from __future__ import annotations

import numpy as np

from krea2.curate.colour_table import BLACK_MAX, WHITE_MIN
from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most
from krea2.curate.pixel_pass import count_within


def _share_within(pixels: np.ndarray, lo: int, hi: int) -> float:
    count = count_within(pixels, np.full(3, lo), np.full(3, hi))
    return count / (pixels.shape[0] * pixels.shape[1])


def white_ratio(pixels: np.ndarray) -> float:
    """Share of pixels whose three channels are all ≥ 250 (the white/black ratios of the
    analysis come from the colour lookup, ``Planes.colours``; this is the direct count)."""
    return _share_within(pixels, WHITE_MIN, 255)


def black_ratio(pixels: np.ndarray) -> float:
    """Share of pixels whose three channels are all ≤ 5."""
    return _share_within(pixels, 0, BLACK_MAX)


def white(pixels: np.ndarray, t: StageThresholds, ratio: float | None = None) -> FilterResult:
    """``ratio``: the pixels' ``white_ratio`` if already known (from the colour lookup)."""
    ratio = white_ratio(pixels) if ratio is None else ratio
    return at_most("white_ratio", ratio, t.max_white_ratio, "white pixel share")


def black(pixels: np.ndarray, t: StageThresholds, ratio: float | None = None) -> FilterResult:
    """``ratio``: the pixels' ``black_ratio`` if already known (from the colour lookup)."""
    ratio = black_ratio(pixels) if ratio is None else ratio
    return at_most("black_ratio", ratio, t.max_black_ratio, "black pixel share")
