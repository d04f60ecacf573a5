"""The crop ladder: DCT hashes of nested centred crops, so that crops and overlays still match.

A global phash moves by 20-50 of 144 bits when 5-8% of each side is cropped away or when a
watermark covers 1.5% of the frame (its DCT mixes every pixel into every bit). The ladder
hashes ``LEVELS`` centred crops of the analysis luma keeping ``RATIO ** i`` of each side
(1, 0.94, 0.88, … 0.57). A centred crop keeping s ≈ ``RATIO ** j`` of each side turns the
original's level ``i + j`` into the copy's level ``i`` (within half a rung, 3%), for every
``i``; an overlay in a corner or a caption strip along an edge lies outside the inner
levels, which then match at ``j = 0``; re-encodes, resizes and tone curves leave every level
in place.

Two ladders are compared along the diagonals of level pairs ``(i, i + j)`` with ``|j| ≤
MAX_SHIFT`` (the copy keeps ≥ 0.83 of each side, so a smaller crop, or a different view
that overlaps less, is never a pair): their distance is the smallest ``SUPPORT``-th
smallest Hamming distance along one diagonal, i.e. ``SUPPORT`` levels of one scale must
all agree. One level alone is not enough: the inner crops of simple scenes (a gradient and
one shape) agree by layout alone.

Each level is a 32×32 grid of exact area means (bilinear reads of the integral image, so
fractional crop edges integrate the same scene content in a copy and its original), the
top-left 12×12 DCT-II coefficients, and one bit per coefficient above their median: 18
bytes, like ``hashes.phash_bytes`` at hash size 12. A level whose grid is nearly flat (grey
standard deviation below ``MIN_STD``) carries no information and is stored as 18 zero bytes
(a real level always has its DC bit, the first, set), which never matches anything.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from krea2.curate.pixel_pass import frozen

LEVELS = 10
RATIO = 0.94
MAX_SHIFT = 3  # rungs apart a level pair may be: RATIO ** 3 = 0.83
SUPPORT = 3  # level pairs of one scale that must agree
GRID = 32
HASH_SIZE = 12
LEVEL_BYTES = HASH_SIZE * HASH_SIZE // 8
LADDER_BYTES = LEVELS * LEVEL_BYTES
MIN_STD = 2.0  # grey levels: flatter levels are left empty
NO_MATCH = 255  # distance of a pair without SUPPORT comparable levels on a diagonal


@lru_cache(maxsize=1)
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(LEVELS,) crop fractions and (HASH_SIZE, GRID) unnormalised DCT-II rows."""
    fractions = RATIO ** np.arange(LEVELS, dtype=np.float64)
    k = np.arange(HASH_SIZE)[:, None]
    rows = 2 * np.cos(np.pi * k * (2 * np.arange(GRID)[None, :] + 1) / (2 * GRID))
    for a in (fractions, rows):
        a.setflags(write=False)
    return fractions, rows


@njit(cache=True, nogil=True)
def _integral(luma: np.ndarray) -> np.ndarray:
    """(h, w) uint8 → (h + 1, w + 1) float64 sums of every top-left rectangle."""
    h, w = luma.shape
    out = np.zeros((h + 1, w + 1))
    for y in range(h):
        run = 0.0
        for x in range(w):
            run += luma[y, x]
            out[y + 1, x + 1] = out[y, x + 1] + run
    return out


@njit(cache=True, nogil=True)
def _at(integral: np.ndarray, y: float, x: float) -> float:
    """The integral image at a fractional point: bilinear, exact for pixels constant
    over their unit squares."""
    h, w = integral.shape[0] - 1, integral.shape[1] - 1
    y0, x0 = min(int(y), h - 1), min(int(x), w - 1)  # at the far edge: the last square's side
    fy, fx = y - y0, x - x0
    top = integral[y0, x0] * (1 - fx) + integral[y0, x0 + 1] * fx
    bottom = integral[y0 + 1, x0] * (1 - fx) + integral[y0 + 1, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


@njit(cache=True, nogil=True)
def _level(integral: np.ndarray, fraction: float, rows: np.ndarray, out: np.ndarray) -> None:
    """Hash the centred crop keeping ``fraction`` of each side into ``out`` (LEVEL_BYTES).
    ``integral`` is that of the transposed luma: (w + 1, h + 1)."""
    w, h = integral.shape[0] - 1, integral.shape[1] - 1
    n = rows.shape[1]
    y0, x0 = h * (1 - fraction) / 2, w * (1 - fraction) / 2
    dy, dx = h * fraction / n, w * fraction / n
    corners = np.empty((n + 1, n + 1))
    for i in range(n + 1):
        for j in range(n + 1):
            corners[i, j] = _at(integral, x0 + j * dx, y0 + i * dy)
    grid = np.empty((n, n))
    total, squares = 0.0, 0.0
    for i in range(n):
        for j in range(n):
            v = corners[i + 1, j + 1] - corners[i + 1, j] - corners[i, j + 1] + corners[i, j]
            v /= dy * dx
            grid[i, j] = v
            total += v
            squares += v * v
    mean = total / (n * n)
    out[:] = 0
    if squares / (n * n) - mean * mean < MIN_STD * MIN_STD:
        return  # flat: no information, never matched
    k = rows.shape[0]
    half = np.zeros((k, n))  # rows · grid, then · rowsᵀ: only the kept k×k block
    for a in range(k):
        for y in range(n):
            c = rows[a, y]
            for x in range(n):
                half[a, x] += c * grid[y, x]
    coeffs = np.zeros(k * k)
    for a in range(k):
        for b in range(k):
            acc = 0.0
            for x in range(n):
                acc += half[a, x] * rows[b, x]
            coeffs[a * k + b] = acc
    tolerance = 1e-9 * abs(coeffs[0])  # rounding residue where the exact value is 0
    for i in range(coeffs.size):
        if abs(coeffs[i]) < tolerance:
            coeffs[i] = 0.0
    median = np.median(coeffs)
    for i in range(k * k):
        if coeffs[i] > median:
            out[i >> 3] |= np.uint8(1 << (7 - (i & 7)))


@njit(cache=True, nogil=True)
def _ladder(luma_t: np.ndarray, fractions: np.ndarray, rows: np.ndarray) -> np.ndarray:
    integral = _integral(luma_t)
    out = np.zeros((fractions.size, rows.shape[0] * rows.shape[0] // 8), np.uint8)
    for i in range(fractions.size):
        _level(integral, fractions[i], rows, out[i])
    return out


def ladder_bytes(luma: np.ndarray) -> bytes:
    """(h, w) uint8 luma (the analysis pixels' ``Planes.luma``) → the ladder, ``LADDER_BYTES``
    bytes: ``LEVELS`` hashes of ``LEVEL_BYTES``, outermost first."""
    fractions, rows = _tables()
    return _ladder(frozen(luma.T), fractions, rows).tobytes()  # Planes.luma.T: no copy


@njit(cache=True, nogil=True, inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@njit(cache=True, nogil=True)
def _distances(words, present, pairs, max_shift, support, limit):
    """``words`` (r, LEVELS, 3) uint64 (each level's 18 bytes, zero-padded), ``present``
    (r, LEVELS) bool, ``pairs`` (m, 2) rows → (m,) int64 (see ``ladder_distances``); a
    diagonal is given up once too few of its levels are left to reach ``support`` within
    ``limit``."""
    m, levels = pairs.shape[0], words.shape[1]
    out = np.full(m, NO_MATCH, np.int64)
    smallest = np.empty(support, np.int64)  # the ``support`` smallest along one diagonal
    for p in range(m):
        a, b = pairs[p, 0], pairs[p, 1]
        for shift in range(-max_shift, max_shift + 1):
            count = 0
            hi = min(levels, levels - shift)
            for i in range(max(0, -shift), hi):
                j = i + shift
                if not (present[a, i] and present[b, j]):
                    continue
                d = 0
                for k in range(words.shape[2]):
                    d += _popcount(words[a, i, k] ^ words[b, j, k])
                if d > limit:
                    if min(count, support) + hi - 1 - i < support:
                        break  # the rest of this diagonal cannot reach ``support``
                    continue
                # insert d into the sorted ``smallest`` (keeping at most ``support``)
                at = min(count, support)
                while at > 0 and smallest[at - 1] > d:
                    if at < support:
                        smallest[at] = smallest[at - 1]
                    at -= 1
                if at < support:
                    smallest[at] = d
                count += 1
            if count >= support and smallest[support - 1] < out[p]:
                out[p] = smallest[support - 1]
    return out


def ladder_distances(
    ladders: np.ndarray,
    pairs: np.ndarray,
    max_shift: int = MAX_SHIFT,
    support: int = SUPPORT,
    limit: int = NO_MATCH,
    batch: int = 1 << 18,
) -> np.ndarray:
    """(n, LADDER_BYTES) uint8 ladders (may be a memmap), (m, 2) int64 row pairs → (m,) int64
    ladder distances: over the diagonals of level pairs (i, i + shift), ``|shift| ≤
    max_shift``, the smallest ``support``-th smallest Hamming distance along one diagonal
    (``NO_MATCH`` when no diagonal has that many non-empty level pairs). A pair within
    ``t`` matches at ``support`` levels of one consistent scale, each within ``t`` bits.
    Distances above ``limit`` may come back as ``NO_MATCH`` (they are not worked out). Reads
    only the rows the pairs name, ``batch`` pairs at a time (≤ 2 · batch · 440 B)."""
    out = np.empty(len(pairs), np.int64)
    for start in range(0, len(pairs), batch):
        part = np.asarray(pairs[start : start + batch], np.int64).ravel()
        order = np.argsort(part, kind="stable")  # unique rows and each pair's, by sorting
        ranked = part[order]
        new = np.r_[True, ranked[1:] != ranked[:-1]]
        rows = ranked[new]
        local = np.empty(len(part), np.int64)
        local[order] = np.cumsum(new) - 1
        levels = np.asarray(ladders[rows], np.uint8).reshape(len(rows), LEVELS, LEVEL_BYTES)
        padded = np.zeros((len(rows), LEVELS, 24), np.uint8)
        padded[:, :, :LEVEL_BYTES] = levels
        present = levels[:, :, 0] != 0  # empty level: zeros (a real one has its DC bit set)
        local = local.reshape(-1, 2)
        out[start : start + len(local)] = _distances(
            padded.view(np.uint64), present, local, max_shift, support, limit
        )
    return out
