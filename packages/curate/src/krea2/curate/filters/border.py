"""Border filter: uniform edge bands (letterboxing, frames, padding) ending in a hard line."""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most

UNIFORM = 6.0  # max per-channel std of a band, grey levels
STEP = 24.0  # min colour difference between the band and the line after it
SHARP_SHARE = 0.7  # share of the next line that must differ (a frame's sides cover the rest)


def _band_width(lines: np.ndarray, means: np.ndarray, stds: np.ndarray) -> int:
    """Width of the uniform band at the start of ``lines`` (n, length, 3) uint8 RGB that ends
    in a sharp transition, else 0; ``means``/``stds`` (n,) are each line's grey mean and std.
    A band of the background's own colour never ends in one."""
    if stds[0] > UNIFORM:
        return 0
    limit = len(lines) // 2
    off = np.flatnonzero((np.abs(means[1:limit] - means[0]) > UNIFORM) | (stds[1:limit] > UNIFORM))
    if not len(off):
        return 0
    k = 1 + int(off[0])  # the first line that is not part of the band
    length = lines.shape[1]
    # Grey alone cannot see a chroma change: the band's first and last lines must match.
    ends = np.concatenate([lines[0], lines[k - 1]]).astype(np.float64)
    colour = ends[:length].mean(axis=0)
    if np.abs(ends - colour).max() > 4 * UNIFORM:
        return 0
    # The resize may blend one line, so the hard edge is at k or k + 1.
    for line in lines[k : k + 2]:
        diff = np.abs(line - colour).max(axis=1)
        if np.count_nonzero(diff > STEP) >= SHARP_SHARE * length:
            return k
    return 0


def _line_stats(grey: np.ndarray, square: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of each row (``dim=1``) or column (``dim=0``) of (h, w) uint8 grey, given
    its (h, w) float32 square."""
    mean = cv2.reduce(grey, dim, cv2.REDUCE_AVG, dtype=cv2.CV_32F).ravel()
    mean_square = cv2.reduce(square, dim, cv2.REDUCE_AVG).ravel()
    return mean, np.sqrt(np.maximum(mean_square - mean * mean, 0.0))


def border_fraction(pixels: np.ndarray, grey: np.ndarray | None = None) -> float:
    """Widest hard-edged uniform band over the four edges, as a share of that dimension.
    ``pixels`` (h, w, 3) uint8 RGB; ``grey`` its (h, w) uint8 luma if already computed."""
    if grey is None:
        grey = cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
    h, w = grey.shape
    square = cv2.multiply(grey, grey, dtype=cv2.CV_32F)
    row_mean, row_std = _line_stats(grey, square, 1)
    col_mean, col_std = _line_stats(grey, square, 0)
    cols = pixels.transpose(1, 0, 2)
    edges = (
        (pixels, row_mean, row_std, h),  # top
        (pixels[::-1], row_mean[::-1], row_std[::-1], h),  # bottom
        (cols, col_mean, col_std, w),  # left
        (cols[::-1], col_mean[::-1], col_std[::-1], w),  # right
    )
    return max(_band_width(lines, m, sd) / size for lines, m, sd, size in edges)


def border(pixels: np.ndarray, grey: np.ndarray, t: StageThresholds) -> FilterResult:
    score = border_fraction(pixels, grey)
    return at_most("border", score, t.max_border_fraction, "border band share")
