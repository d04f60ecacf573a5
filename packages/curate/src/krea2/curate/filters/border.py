"""Border filter: uniform edge bands (letterboxing, frames, padding) ending in a hard line."""

from __future__ import annotations

import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most

UNIFORM = 6.0  # max per-channel std of a band, grey levels
STEP = 24.0  # min colour difference between the band and the line after it
SHARP_SHARE = 0.7  # share of the next line that must differ (a frame's sides cover the rest)


def _band_width(lines: np.ndarray) -> int:
    """Width of the uniform band at the start of ``lines`` (n, length, 3) float32 that ends
    in a sharp transition, else 0. A band of the background's own colour never ends in one."""
    first = lines[0]
    if first.std(axis=0).max() > UNIFORM:
        return 0
    colour = first.mean(axis=0)
    limit = len(lines) // 2
    k = 1
    while k < limit:
        line = lines[k]
        if np.abs(line.mean(axis=0) - colour).max() > UNIFORM or line.std(axis=0).max() > UNIFORM:
            break
        k += 1
    if k >= limit:
        return 0
    # The band ends at k; the resize may blend one line, so the hard edge is at k or k + 1.
    for line in lines[k : k + 2]:
        if (np.abs(line - colour).max(axis=1) > STEP).mean() >= SHARP_SHARE:
            return k
    return 0


def border_fraction(pixels: np.ndarray) -> float:
    """Widest hard-edged uniform band over the four edges, as a share of that dimension."""
    img = pixels.astype(np.float32)
    h, w = img.shape[:2]
    edges = (
        (img, h),  # top: rows from the top
        (img[::-1], h),  # bottom
        (img.transpose(1, 0, 2), w),  # left: columns as lines
        (img.transpose(1, 0, 2)[::-1], w),  # right
    )
    return max(_band_width(lines) / size for lines, size in edges)


def border(pixels: np.ndarray, t: StageThresholds) -> FilterResult:
    return at_most("border", border_fraction(pixels), t.max_border_fraction, "border band share")
