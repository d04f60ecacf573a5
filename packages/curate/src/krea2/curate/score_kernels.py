"""The compiled score kernels of the border, entropy and flat-colour filters.

They run inside the one measurement call (``planes._measure``) right after the pixel pass,
and the filters' standalone functions (``filters.border``, ``filters.entropy``,
``filters.flat``) call them too, so each score has one implementation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from krea2.curate.pixel_pass import channel_medians, count_pixels_within

# -- border: uniform edge bands ending in a hard line -----------------------------------------

UNIFORM = 6.0  # max per-channel std of a band, grey levels
STEP = 24.0  # min colour difference between the band and the line after it
SHARP_SHARE = 0.7  # share of the next line that must differ (a frame's sides cover the rest)


TOP, BOTTOM, LEFT, RIGHT = 0, 1, 2, 3  # edges; TOP and BOTTOM (< LEFT) run along rows


@njit(cache=True, nogil=True)
def _line_index(edge: int, i: int, n: int) -> int:
    """Row or column of the i-th line counted from ``edge`` (n lines)."""
    return i if edge in (TOP, LEFT) else n - 1 - i


@njit(cache=True, nogil=True)
def _pixel(px: np.ndarray, edge: int, line: int, j: int, c: int) -> float:
    """Channel c of pixel j of row/column ``line`` (already mapped by ``_line_index``)."""
    if edge < LEFT:
        return float(px[line, j, c])
    return float(px[j, line, c])


@njit(cache=True, nogil=True)
def _band_width(px: np.ndarray, means: np.ndarray, stds: np.ndarray, edge: int) -> int:
    """Width in lines of the uniform band along ``edge`` of (h, w, 3) uint8 RGB ``px`` that
    ends in a sharp transition, else 0. ``means``/``stds``: the grey mean and std of every
    row (TOP, BOTTOM) or column (LEFT, RIGHT), in image order. A band of the background's
    own colour never ends in one."""
    h, w = px.shape[0], px.shape[1]
    n, length = (h, w) if edge < LEFT else (w, h)
    first = _line_index(edge, 0, n)
    if stds[first] > UNIFORM:
        return 0
    k = 0  # the first line that is not part of the band
    for i in range(1, n // 2):
        line = _line_index(edge, i, n)
        if abs(means[line] - means[first]) > UNIFORM or stds[line] > UNIFORM:
            k = i
            break
    if k == 0:
        return 0
    # Grey alone cannot see a chroma change: the band's first and last lines must match.
    last = _line_index(edge, k - 1, n)
    colour = np.zeros(3)
    for j in range(length):
        for c in range(3):
            colour[c] += _pixel(px, edge, first, j, c) / length
    for line in (first, last):
        for j in range(length):
            for c in range(3):
                if abs(_pixel(px, edge, line, j, c) - colour[c]) > 4 * UNIFORM:
                    return 0
    # The resize may blend one line, so the hard edge is at k or k + 1.
    for i in range(k, min(k + 2, n)):
        line = _line_index(edge, i, n)
        sharp = 0
        for j in range(length):
            diff = 0.0
            for c in range(3):
                diff = max(diff, abs(_pixel(px, edge, line, j, c) - colour[c]))
            sharp += diff > STEP
        if sharp >= SHARP_SHARE * length:
            return k
    return 0


@njit(cache=True, nogil=True)
def widest_band(px, row_mean, row_std, col_mean, col_std) -> float:
    """The widest of the four edges' bands (``_band_width``) as a share of its dimension."""
    h, w = px.shape[0], px.shape[1]
    return max(
        max(_band_width(px, row_mean, row_std, TOP), _band_width(px, row_mean, row_std, BOTTOM))
        / h,
        max(_band_width(px, col_mean, col_std, LEFT), _band_width(px, col_mean, col_std, RIGHT))
        / w,
    )


# -- entropy ------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def entropy_bits(hists: np.ndarray) -> float:
    """(3, 256) int64 counts → mean per-channel Shannon entropy, bits."""
    n = hists[0].sum()
    total = 0.0
    for c in range(3):
        for level in range(256):
            if hists[c, level] > 0:
                p = hists[c, level] / n
                total -= p * np.log2(p)
    return total / 3


# -- flat colour --------------------------------------------------------------------------------

TOLERANCE = 8  # grey levels per channel around the dominant colour (absorbs JPEG noise)


@njit(cache=True, nogil=True)
def flat_count(px: np.ndarray, hists: np.ndarray) -> int:
    """Pixels of C-contiguous (h, w, 3) uint8 ``px`` within ±TOLERANCE of the per-channel
    median of (3, 256) int64 ``hists`` (numpy's median: a half level between the two middle
    values of an even count)."""
    centre = channel_medians(hists)
    lo = np.empty(3, np.uint8)
    hi = np.empty(3, np.uint8)
    for c in range(3):  # the integer levels within ±TOLERANCE of the centre
        lo[c] = min(max(np.ceil(centre[c] - TOLERANCE), 0), 255)
        hi[c] = min(max(np.floor(centre[c] + TOLERANCE), 0), 255)
    return count_pixels_within(px, lo, hi)
