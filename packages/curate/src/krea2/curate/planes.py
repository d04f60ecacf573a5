"""What the cheap filters and the hashes read besides the pixels, computed once per image.

The filters want OpenCV's grey, the three channel histograms, the white/black pixel counts,
the grey mean and spread of every row and column and the Laplacian tile variances; the
hashes want Pillow's luma and the colour-class counts. All of it, and the scores of the
filters that need nothing else (Laplacian, neighbour correlation, entropy, flat colour,
border), comes out of one compiled call (``_measure``: ``pixel_pass.read_pixels`` and
``score_kernels``), with the colour classes and the white/black marks looked up in the table
of every 24-bit colour (``colour_table``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from krea2.curate.colour_table import ColourStats, code_counts, index_table, present_codes
from krea2.curate.pixel_pass import frozen, grey_neighbour_correlation, mean_std, read_pixels
from krea2.curate.score_kernels import entropy_bits, flat_count, widest_band


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
    per-row and per-column grey statistics. The scores of five filters, each equal to its
    standalone function: ``laplacian_var`` (``laplacian_variance``), ``neighbour_corr``
    (``pixel_pass.neighbour_correlation``), ``entropy``
    (``rgb_entropy``), ``flat_ratio`` (``flat_ratio``), ``border_fraction``
    (``border_fraction``).
    """

    grey: np.ndarray
    luma: np.ndarray
    hists: np.ndarray
    colours: ColourStats
    lines: LineStats
    laplacian_var: float
    neighbour_corr: float
    entropy: float
    flat_ratio: float
    border_fraction: float


@njit(cache=True, nogil=True)
def _measure(px: np.ndarray, table: np.ndarray, present: np.ndarray):
    """Everything ``Planes`` holds, in one compiled call: the pixel pass and what follows
    from its sums. One call, because right after a decode every separate numpy call finds
    its code and data evicted (measured: 20-75 µs for ``np.median`` of 64 values, against
    ~2-10 µs for a compiled call)."""
    h, w = px.shape[0], px.shape[1]
    grey, luma_t, hists, index, rows, cols, lap = read_pixels(px, table)
    counts, white, black = code_counts(index, present)
    row_mean, row_std = mean_std(rows, w)
    col_mean, col_std = mean_std(cols, h)
    return (
        grey,
        luma_t,
        hists,
        counts,
        white,
        black,
        (row_mean, row_std, col_mean, col_std),
        np.median(lap),
        grey_neighbour_correlation(grey),
        entropy_bits(hists),
        flat_count(px, hists) / (h * w),
        widest_band(px, row_mean, row_std, col_mean, col_std),
    )


def planes(pixels: np.ndarray) -> Planes:
    """Compute every shared measurement of (h, w, 3) uint8 RGB ``pixels``."""
    h, w = pixels.shape[:2]
    grey, luma_t, hists, counts, white, black, lines, lap, corr, entropy, flat, band = _measure(
        frozen(pixels), index_table(), present_codes()
    )
    return Planes(
        grey=grey,
        luma=luma_t.T,
        hists=hists,
        colours=ColourStats(counts, int(white), int(black), h * w),
        lines=LineStats(*lines),
        laplacian_var=float(lap),
        neighbour_corr=float(corr),
        entropy=float(entropy),
        flat_ratio=float(flat),
        border_fraction=float(band),
    )


def pillow_luma(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB → (h, w) uint8 Pillow ``L`` (ITU-R 601-2 luma, the conversion
    imagehash uses): ``(19595 r + 38470 g + 7471 b + 2^15) >> 16``."""
    return planes(pixels).luma
