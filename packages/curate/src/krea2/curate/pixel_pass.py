"""The per-pixel work of the cheap filters and hashes, fused into compiled loops (numba).

Every filter and hash reads the same (h, w, 3) uint8 analysis pixels. As separate
OpenCV/numpy calls they read them about ten times and, run one after another after a
decode, each finds its data evicted: at 256 px that cost ~2.7 ms per image against a
~1.4 ms decode of a ShapesWorld JPEG. Here one pass reads the pixels and writes everything
that depends on the pixel alone:

- OpenCV's grey (``COLOR_RGB2GRAY``: ``(9798 r + 19235 g + 3735 b + 2^14) >> 15``), which
  the Laplacian, Canny and border filters read;
- Pillow's luma (``convert("L")``: ``(19595 r + 38470 g + 7471 b + 2^15) >> 16``), which
  phash reads;
- the three channel histograms (entropy, the flat-colour median);
- the histogram of the colour table's index per pixel (colorhash, the hue histogram, the
  white/black counts; ``colour_table``);
- per-row and per-column sums of grey and grey² (the border filter's line statistics);
- the 3×3 Laplacian's variance per tile (from the finished grey plane);
- the correlation of grey with its right and lower neighbours (``neighbour_correlation``).

The arithmetic runs row by row in loops the compiler vectorises; the histograms are counted
after, by runs of one colour (``_colour_counts``). All sums are integers, so every result
is exact. ``planes._measure`` calls this and the filters' own kernels in one compiled call.

Compiled once per machine: ``cache=True`` keeps the machine code next to this file, and
later processes (the isolated decode children, the CLI workers) load it in about a second.
numba compiles one version per argument type, and a read-only array is another type (a
decode hands back read-only or writable pixels depending on the path), so the public
functions here pass every array as a read-only C-contiguous view: one version each.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Counters per histogram: 256 bins + 16 of padding. At a stride of 256 int64 (2 KiB) the
# same level of R and B sits 4 KiB apart, and the CPU then takes a store to one for a store
# to the other (4K aliasing) and stalls the next load (measured ~1.5× slower).
STRIDE = 272
TILES = 8  # the Laplacian filter cuts the image into TILES × TILES tiles


def frozen(a: np.ndarray, dtype: type = np.uint8) -> np.ndarray:
    """A read-only C-contiguous view of ``a`` as ``dtype`` (copied only when it is not
    already C-contiguous of that dtype): the one argument type each kernel is compiled for."""
    view = np.ascontiguousarray(a, dtype=dtype).view()
    view.flags.writeable = False
    return view


def laplacian_tiles(grey: np.ndarray) -> np.ndarray:
    """(h, w) uint8 → (TILES, TILES) float64 Laplacian variance per tile; see
    ``_laplacian_tiles``."""
    return _laplacian_tiles(frozen(grey))


def count_within(px: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> int:
    """Pixels of (h, w, 3) uint8 ``px`` with lo[c] ≤ px[..., c] ≤ hi[c] on every channel
    (``cv2.inRange``); ``lo``, ``hi``: 3 levels each, lo ≤ hi."""
    return int(count_pixels_within(frozen(px), frozen(lo), frozen(hi)))


@njit(cache=True, nogil=True)
def mean_std(sums: np.ndarray, n: int):
    """(2, m) int64 sums of x and x² over n values each → (m,) means and (m,) stds."""
    mean = sums[0] / n
    return mean, np.sqrt(np.maximum(sums[1] / n - mean * mean, 0.0))


@njit(cache=True, nogil=True)
def channel_medians(hists: np.ndarray) -> np.ndarray:
    """(3, 256) int64 counts → (3,) float64 per-channel median (numpy's: the mean of the two
    middle values for an even count)."""
    n = hists[0].sum()
    ranks = ((n - 1) // 2, n // 2)
    out = np.zeros(3)
    for c in range(3):
        for rank in ranks:
            seen = 0
            for level in range(256):
                seen += hists[c, level]
                if seen > rank:
                    out[c] += level / 2
                    break
    return out


@njit(cache=True, nogil=True)
def read_pixels(px: np.ndarray, table: np.ndarray):
    """One read of (h, w, 3) uint8 RGB ``px`` (C-contiguous).

    ``table``: (2^24,) uint8 colour-table index of ``r | g << 8 | b << 16``.
    Returns ``grey`` (h, w) uint8 OpenCV grey, ``luma_t`` (w, h) uint8 Pillow ``L``,
    transposed (phash's first pass, horizontal, reads columns: ``resample``),
    ``channels`` (3, 256) int64 counts per channel level, ``index`` (256,) int64 counts per
    table index, ``rows`` (2, h) and ``cols`` (2, w) int64 sums of grey and of grey² per
    row and per column, and the Laplacian tile variances (``_laplacian_tiles`` of grey).
    """
    h, w = px.shape[0], px.shape[1]
    flat = px.reshape(-1)  # a constant stride of 3 between pixels: the loads vectorise
    grey = np.empty(h * w, np.uint8)
    luma_t = np.empty((w, h), np.uint8)
    rows = np.zeros((2, h), np.int64)
    cols = np.zeros((2, w), np.int64)
    luma_row = np.empty(w, np.uint8)
    for y in range(h):
        o = y * w
        for x in range(w):
            i = 3 * (o + x)
            r = np.int32(flat[i])
            g = np.int32(flat[i + 1])
            b = np.int32(flat[i + 2])
            grey[o + x] = (9798 * r + 19235 * g + 3735 * b + 16384) >> 15
            luma_row[x] = (19595 * r + 38470 * g + 7471 * b + 32768) >> 16
        for x in range(w):
            luma_t[x, y] = luma_row[x]
        row_sum = 0
        row_sq = 0
        for x in range(w):
            v = np.int64(grey[o + x])
            row_sum += v
            row_sq += v * v
            cols[0, x] += v
            cols[1, x] += v * v
        rows[0, y] = row_sum
        rows[1, y] = row_sq
    channels, index = _colour_counts(flat, table)
    grey2 = grey.reshape(h, w)
    return grey2, luma_t, channels, index, rows, cols, _laplacian_tiles(grey2)


@njit(cache=True, nogil=True)
def _colour_counts(flat: np.ndarray, table: np.ndarray):
    """Channel histograms (3, 256) and table-index counts (256,), int64, of the RGB pixels
    in ``flat`` (3·n uint8), counted by runs of one colour: a run costs one table lookup
    and four adds however long it is (most pixels of a synthetic image sit in runs; a
    photo's runs are a pixel or two long, and then this is a plain histogram)."""
    channels = np.zeros(3 * STRIDE, np.int64)
    index = np.zeros(STRIDE, np.int64)
    n = flat.size // 3
    run_colour = -1  # no colour: nothing to count before the first pixel or after the last
    run = 0
    for i in range(n + 1):
        colour = -1
        if i < n:
            colour = (np.int64(flat[3 * i]) | (np.int64(flat[3 * i + 1]) << 8)) | (
                np.int64(flat[3 * i + 2]) << 16
            )
        if colour == run_colour:
            run += 1
            continue
        if run_colour >= 0:
            channels[run_colour & 255] += run
            channels[STRIDE + ((run_colour >> 8) & 255)] += run
            channels[2 * STRIDE + (run_colour >> 16)] += run
            index[table[run_colour]] += run
        run_colour = colour
        run = 1
    return channels.reshape(3, STRIDE)[:, :256].copy(), index[:256].copy()


@njit(cache=True, nogil=True)
def _reflect101(i: int, n: int) -> int:
    """OpenCV's default border (``BORDER_REFLECT_101``): -1 → 1, n → n - 2."""
    if n == 1:
        return 0
    if i < 0:
        return -i
    if i >= n:
        return 2 * n - 2 - i
    return i


@njit(cache=True, nogil=True)
def _laplacian_row(grey: np.ndarray, y: int, out: np.ndarray) -> None:
    """Row y of the 3×3 Laplacian of (h, w) uint8 ``grey`` into (w,) int32 ``out``."""
    h, w = grey.shape
    up, mid, down = grey[_reflect101(y - 1, h)], grey[y], grey[_reflect101(y + 1, h)]
    for x in range(1, w - 1):  # the interior: no border cases, so it vectorises
        out[x] = (
            np.int32(up[x])
            + np.int32(down[x])
            + np.int32(mid[x - 1])
            + np.int32(mid[x + 1])
            - 4 * np.int32(mid[x])
        )
    for x in (0, w - 1):
        left, right = mid[_reflect101(x - 1, w)], mid[_reflect101(x + 1, w)]
        out[x] = (
            np.int32(up[x]) + np.int32(down[x]) + np.int32(left) + np.int32(right)
        ) - 4 * np.int32(mid[x])


@njit(cache=True, nogil=True)
def _laplacian_tiles(grey: np.ndarray) -> np.ndarray:
    """(h, w) uint8 → (TILES, TILES) float64 variance of the 3×3 Laplacian
    (``cv2.Laplacian(grey, ksize=1)``: up + down + left + right − 4·centre, with OpenCV's
    default border, ``BORDER_REFLECT_101``) over each tile of an (h // TILES) × (w // TILES)
    px grid; the remainder rows and columns are left out. When a tile would be under 2×2
    px: a (1, 1) array with the variance over the whole image."""
    h, w = grey.shape
    th, tw = h // TILES, w // TILES
    n_tiles = TILES
    if th < 2 or tw < 2:
        n_tiles, th, tw = 1, h, w
    sums = np.zeros((n_tiles, n_tiles), np.int64)
    squares = np.zeros((n_tiles, n_tiles), np.int64)
    lap = np.empty(w, np.int32)
    for y in range(th * n_tiles):
        _laplacian_row(grey, y, lap)
        ty = y // th
        for tx in range(n_tiles):
            s = 0
            q = 0
            for x in range(tx * tw, (tx + 1) * tw):
                s += lap[x]
                q += lap[x] * lap[x]
            sums[ty, tx] += s
            squares[ty, tx] += q
    n = th * tw
    mean = sums / n
    return squares / n - mean * mean


@njit(cache=True, nogil=True)
def _pair_correlation(n: int, sa: int, sb: int, saa: int, sbb: int, sab: int) -> float:
    """Pearson correlation of n pairs (a, b) from their integer sums; 1.0 when either side
    is constant (a flat plane is the opposite of noise). In float64: n·Σab overflows int64
    past ~16 MP, and at the 256-px analysis size every product is still exact."""
    fn = np.float64(n)
    cov = fn * np.float64(sab) - np.float64(sa) * np.float64(sb)
    var_a = fn * np.float64(saa) - np.float64(sa) * np.float64(sa)
    var_b = fn * np.float64(sbb) - np.float64(sb) * np.float64(sb)
    if var_a <= 0 or var_b <= 0:
        return 1.0
    return cov / np.sqrt(var_a * var_b)


@njit(cache=True, nogil=True)
def grey_neighbour_correlation(grey: np.ndarray) -> float:
    """``neighbour_correlation``, compiled, for other kernels: (h, w) uint8 → mean of the
    Pearson correlations of each pixel with its right neighbour and with the one below (1.0
    for an image under 2 px on a side), from exact integer sums."""
    h, w = grey.shape
    if h < 2 or w < 2:
        return 1.0
    hs = np.zeros(6, np.int64)  # n, Σa, Σb, Σa², Σb², Σab of horizontal pairs
    vs = np.zeros(6, np.int64)  # the same for vertical pairs
    for y in range(h):
        row = grey[y]
        for x in range(w - 1):
            a, b = np.int64(row[x]), np.int64(row[x + 1])
            hs[1] += a
            hs[2] += b
            hs[3] += a * a
            hs[4] += b * b
            hs[5] += a * b
        if y + 1 < h:
            below = grey[y + 1]
            for x in range(w):
                a, b = np.int64(row[x]), np.int64(below[x])
                vs[1] += a
                vs[2] += b
                vs[3] += a * a
                vs[4] += b * b
                vs[5] += a * b
    hs[0] = h * (w - 1)
    vs[0] = (h - 1) * w
    across = _pair_correlation(hs[0], hs[1], hs[2], hs[3], hs[4], hs[5])
    down = _pair_correlation(vs[0], vs[1], vs[2], vs[3], vs[4], vs[5])
    return 0.5 * (across + down)


def neighbour_correlation(grey: np.ndarray) -> float:
    """(h, w) uint8 → how much each pixel predicts its neighbours, −1..1: the mean Pearson
    correlation of grey with its right and its lower neighbour. Photographs, textures
    included, sit high (≥ 0.65 on the bundled photos at the 256-px analysis size, grass the
    lowest): their spectra fall with frequency. A noise pattern stays near 0 at any size,
    since reducing white noise to the analysis size leaves it white."""
    return float(grey_neighbour_correlation(frozen(grey)))


@njit(cache=True, nogil=True)
def count_pixels_within(px: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> int:
    """``count_within``, compiled, for other kernels: C-contiguous ``px``, (3,) uint8 ``lo``,
    ``hi``."""
    flat = px.reshape(-1)
    # v in [lo, hi] ⇔ (v − lo) mod 256 ≤ hi − lo: one unsigned compare, no branches.
    l0, l1, l2 = lo[0], lo[1], lo[2]
    s0, s1, s2 = hi[0] - l0, hi[1] - l1, hi[2] - l2
    count = 0
    for i in range(flat.size // 3):
        inside = np.uint8(flat[3 * i] - l0) <= s0
        inside &= np.uint8(flat[3 * i + 1] - l1) <= s1
        inside &= np.uint8(flat[3 * i + 2] - l2) <= s2
        count += inside
    return count
