"""What the cheap filters and the hashes read besides the pixels, computed once per image.

The filters want OpenCV's grey, the three channel histograms, the white/black pixel counts,
the grey mean and spread of every row and column and the Laplacian tile variances; the
hashes want Pillow's luma and the colour-class counts. All of it comes out of one compiled
call over the pixels (``pixel_pass.shared_measurements``), with the colour classes and the
white/black marks looked up in the table of every 24-bit colour (``colour_table``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from krea2.curate.colour_table import ColourStats, index_table, present_codes
from krea2.curate.pixel_pass import shared_measurements


@dataclass(frozen=True)
class LineStats:
    """Grey mean and standard deviation of each row (``row_mean``, ``row_std``: (h,)) and
    each column (``col_mean``, ``col_std``: (w,)), float64 grey levels."""

    row_mean: np.ndarray
    row_std: np.ndarray
    col_mean: np.ndarray
    col_std: np.ndarray


@dataclass(frozen=True)
class Planes:
    """Shared intermediates of one image's (h, w, 3) uint8 RGB pixels.

    ``grey``: (h, w) uint8 OpenCV luma (``COLOR_RGB2GRAY``; the filters). ``luma``: (h, w)
    uint8 Pillow ``L`` (phash, as imagehash converts), a transposed view of a C-contiguous
    (w, h) array, the layout phash's horizontal Lanczos pass reads. ``hists``: (3, 256) int64 pixel
    counts per channel level. ``colours``: colour-class and white/black counts. ``lines``:
    per-row and per-column grey statistics (the border filter). ``laplacian_var``: the
    Laplacian filter's score (``filters.laplacian.laplacian_variance`` of ``grey``).
    """

    grey: np.ndarray
    luma: np.ndarray
    hists: np.ndarray
    colours: ColourStats
    lines: LineStats
    laplacian_var: float


def planes(pixels: np.ndarray) -> Planes:
    """Compute every shared intermediate of (h, w, 3) uint8 RGB ``pixels``."""
    h, w = pixels.shape[:2]
    (grey, luma_t, hists, counts, white, black, *lines, lap_var) = shared_measurements(
        pixels, index_table(), present_codes()
    )
    return Planes(
        grey=grey,
        luma=luma_t.T,
        hists=hists,
        colours=ColourStats(counts, int(white), int(black), h * w),
        lines=LineStats(*lines),
        laplacian_var=float(lap_var),
    )


def pillow_luma(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB → (h, w) uint8 Pillow ``L`` (ITU-R 601-2 luma, the conversion
    imagehash uses): ``(19595 r + 38470 g + 7471 b + 2^15) >> 16``."""
    return planes(pixels).luma
