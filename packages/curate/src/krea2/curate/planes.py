"""What the cheap filters and the hashes read besides the pixels, computed once per image.

The filters want OpenCV's grey, the three channel histograms, the white/black pixel counts
and the grey mean and spread of every row and column; the hashes want Pillow's luma and the
colour-class counts. All of it comes out of one compiled read of the pixels
(``pixel_pass.first_pass``), with the colour classes and the white/black marks looked up in
the table of every 24-bit colour (``colour_table``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from krea2.curate.colour_table import ColourStats, colour_stats, index_table
from krea2.curate.pixel_pass import first_pass


@dataclass(frozen=True)
class LineStats:
    """Grey mean and standard deviation of each row (``row_mean``, ``row_std``: (h,)) and
    each column (``col_mean``, ``col_std``: (w,)), float64 grey levels."""

    row_mean: np.ndarray
    row_std: np.ndarray
    col_mean: np.ndarray
    col_std: np.ndarray


def _mean_std(sums: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(2, m) sums of x and x² over n values each → (m,) means and (m,) stds."""
    mean = sums[0] / n
    return mean, np.sqrt(np.maximum(sums[1] / n - mean * mean, 0.0))


@dataclass(frozen=True)
class Planes:
    """Shared intermediates of one image's (h, w, 3) uint8 RGB pixels.

    ``grey``: (h, w) uint8 OpenCV luma (``COLOR_RGB2GRAY``; the filters). ``luma``: (h, w)
    uint8 Pillow ``L`` (phash, as imagehash converts), a transposed view of a C-contiguous
    (w, h) array, the layout phash's horizontal Lanczos pass reads. ``hists``: (3, 256) int64 pixel
    counts per channel level. ``colours``: colour-class and white/black counts. ``lines``:
    per-row and per-column grey statistics (the border filter).
    """

    grey: np.ndarray
    luma: np.ndarray
    hists: np.ndarray
    colours: ColourStats
    lines: LineStats


def planes(pixels: np.ndarray) -> Planes:
    """Compute every shared intermediate of (h, w, 3) uint8 RGB ``pixels``."""
    px = np.ascontiguousarray(pixels, dtype=np.uint8)
    h, w = px.shape[:2]
    grey, luma_t, hists, per_index, rows, cols = first_pass(px, index_table())
    row_mean, row_std = _mean_std(rows, w)
    col_mean, col_std = _mean_std(cols, h)
    return Planes(
        grey=grey,
        luma=luma_t.T,
        hists=hists,
        colours=colour_stats(per_index),
        lines=LineStats(row_mean, row_std, col_mean, col_std),
    )


def pillow_luma(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB → (h, w) uint8 Pillow ``L`` (ITU-R 601-2 luma, the conversion
    imagehash uses): ``(19595 r + 38470 g + 7471 b + 2^15) >> 16``."""
    return planes(pixels).luma
