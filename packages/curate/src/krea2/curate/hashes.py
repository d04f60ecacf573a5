"""Content hashes: md5 of the bytes, perceptual phash (8×8 and 12×12), colorhash, a
saturated-hue histogram and the crop ladder (``crop_ladder``).

The perceptual hashes follow imagehash's definitions bit for bit, so a hash computed here
equals ``imagehash.phash(Image.fromarray(pixels), hash_size)`` and
``imagehash.colorhash(Image.fromarray(pixels), binbits)`` on the same pixels. They read the
reduced-scale pixels of the one decode, which is what makes them cheap; imagehash users
typically hash the full-resolution image, so hashes agree with theirs only up to that
resize (tested to stay within a few bits on real photos).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
from numba import njit

from krea2.curate.colour_table import (
    BLACK,
    COLOUR_CLASSES,
    FAINT,
    GREY,
    HUE_BINS,
    HUE_CODES,
    SAT_170,
)
from krea2.curate.crop_ladder import ladder_bytes
from krea2.curate.pixel_pass import frozen
from krea2.curate.planes import Planes, planes
from krea2.curate.resample import lanczos_t, plan

PHASH_HIGHFREQ_FACTOR = 4


def md5(data: bytes) -> str:
    """Hex md5 of the file bytes (exact duplicates)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def pack_bits(bits: np.ndarray) -> bytes:
    """Bool array (any shape, row-major) → bytes, most significant bit first.

    Matches imagehash's hex strings: ``pack_bits(b).hex() == str(ImageHash(b))`` whenever
    the bit count is a multiple of 8.
    """
    return _packed(frozen(bits, np.bool_)).tobytes()


def hamming(a: bytes, b: bytes) -> int:
    """Number of differing bits between two equal-length hashes."""
    if len(a) != len(b):
        raise ValueError(f"hashes differ in length: {len(a)} and {len(b)} bytes")
    x = np.frombuffer(a, np.uint8) ^ np.frombuffer(b, np.uint8)
    return int(np.unpackbits(x).sum())


def phash_bits(pixels: np.ndarray, hash_size: int = 12) -> np.ndarray:
    """Perceptual hash of (h, w, 3) uint8 RGB pixels → (hash_size, hash_size) bool.

    Grey → Lanczos resize to (4·hash_size)² → 2-D DCT-II → the top-left hash_size² block
    (DC included) thresholded at its median.
    """
    packed = np.frombuffer(phash_bytes(planes(pixels).luma, hash_size), np.uint8)
    return np.unpackbits(packed)[: hash_size * hash_size].reshape(hash_size, hash_size) > 0


@lru_cache(maxsize=8)
def dct_rows(hash_size: int) -> np.ndarray:
    """(hash_size, 4·hash_size) float64: the first rows of scipy's unnormalised DCT-II,
    ``2 cos(π k (2n + 1) / 2N)``, the only ones phash keeps."""
    n = hash_size * PHASH_HIGHFREQ_FACTOR
    k = np.arange(hash_size)[:, None]
    rows = 2 * np.cos(np.pi * k * (2 * np.arange(n)[None, :] + 1) / (2 * n))
    rows.setflags(write=False)  # cached and shared
    return rows


# |rounding error| of a coefficient ≤ ~N·eps·max|row|²·Σ pixels; 1e-13 is ~100× that at N = 48.
ZERO_TOLERANCE = 1e-13


@njit(cache=True, nogil=True)
def dct_median_bits(small: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(n, n) uint8 resized luma, (k, n) ``dct_rows`` → (k, k) bool: the top-left k×k
    DCT-II coefficients (rows · small · rowsᵀ) above their median.

    Only the kept k×k block is computed, as two small products instead of the full 2-D
    transform that imagehash takes through scipy; the coefficients agree to ~1e-15 of the
    image's sum. Where scipy's FFT gives exact zeros (a flat image: every AC term; a
    mirror-symmetric one: the odd terms), the products leave rounding residue of that size,
    which would decide bits whenever the median is 0; residue below ``ZERO_TOLERANCE`` of
    the sum is therefore set to 0. Tested bit-equal to imagehash on the bundled photos,
    ShapesWorld scenes, flat and symmetric images.
    """
    k, n = rows.shape
    half = np.zeros((k, n))
    total = 0.0
    for y in range(n):
        for x in range(n):
            total += small[y, x]
    for i in range(k):
        for y in range(n):
            c = rows[i, y]
            for x in range(n):
                half[i, x] += c * small[y, x]
    coeffs = np.zeros((k, k))
    tolerance = ZERO_TOLERANCE * 4.0 * total
    for i in range(k):
        for j in range(k):
            acc = 0.0
            for x in range(n):
                acc += half[i, x] * rows[j, x]
            coeffs[i, j] = acc if abs(acc) > tolerance else 0.0
    return coeffs > np.median(coeffs)


@njit(cache=True, nogil=True)
def _phash_packed(xt, h_weights, h_lo, h_hi, v_weights, v_lo, v_hi, vertical_first, rows):
    """Resize (``resample.lanczos_t`` of the transposed luma ``xt``), DCT, median, packed
    bits: one compiled call per hash."""
    small = lanczos_t(xt, h_weights, h_lo, h_hi, v_weights, v_lo, v_hi, vertical_first)
    return _packed(dct_median_bits(small, rows))


def phash_bytes(luma: np.ndarray, hash_size: int) -> bytes:
    """(h, w) uint8 luma → the packed phash (``pack_bits`` of ``phash_bits``): Lanczos
    resize, DCT, median and packing in one compiled call; free of copies when ``luma`` is
    ``Planes.luma``."""
    h, w = luma.shape
    side = hash_size * PHASH_HIGHFREQ_FACTOR
    xt = frozen(luma.T)
    return _phash_packed(xt, *plan(h, w, side, side), dct_rows(hash_size)).tobytes()


@njit(cache=True, nogil=True)
def _colorhash_values(counts: np.ndarray, binbits: int) -> np.ndarray:
    """(COLOUR_CLASSES, HUE_CODES) int64 counts → (14,) int64 quantised fractions, with
    imagehash's arithmetic: ``int(count / n · 2^b)`` for black and grey, and
    ``int(count · 2^b · 1. / coloured)`` for the 12 hue bins."""
    per_class = np.zeros(COLOUR_CLASSES, np.int64)
    for c in range(COLOUR_CLASSES):
        per_class[c] = counts[c].sum()
    n = per_class.sum()
    coloured = max(1, per_class[FAINT:].sum())  # faint, bright and s == 170
    top = 2**binbits
    values = np.empty(2 + SAT_170 - FAINT, np.int64)
    values[0] = min(top - 1, int(per_class[BLACK] / n * top))
    values[1] = min(top - 1, int(per_class[GREY] / n * top))
    for k in range(FAINT, SAT_170):
        values[k] = min(top - 1, int(float(per_class[k] * top) / coloured))
    return values


@njit(cache=True, nogil=True)
def _colorhash_bits(counts: np.ndarray, binbits: int) -> np.ndarray:
    """colorhash from the pixels' colour counts (``Planes.colours.counts``): (14, binbits)
    bool."""
    values = _colorhash_values(counts, binbits)
    bits = np.zeros((values.size, binbits), np.bool_)
    for k in range(values.size):
        for i in range(binbits):
            # imagehash's bit code: bit i of v is (v // 2^(binbits-i-1)) % 2^(binbits-i) > 0
            bits[k, i] = (values[k] // 2 ** (binbits - i - 1)) % 2 ** (binbits - i) > 0
    return bits


@njit(cache=True, nogil=True)
def _packed(bits: np.ndarray) -> np.ndarray:
    """``pack_bits`` compiled: bools in row-major order → uint8, most significant bit first."""
    flat = bits.ravel()
    out = np.zeros((flat.size + 7) // 8, np.uint8)
    for i in range(flat.size):
        if flat[i]:
            out[i >> 3] |= np.uint8(1 << (7 - (i & 7)))
    return out


@njit(cache=True, nogil=True)
def colour_hash_bytes(counts: np.ndarray):
    """(colorhash with binbits 3, packed to 6 bytes; hue histogram, 19 bytes)."""
    return _packed(_colorhash_bits(counts, 3)), _hue_histogram_values(counts)


def colorhash_bits(pixels: np.ndarray, binbits: int = 3) -> np.ndarray:
    """Colour hash of (h, w, 3) uint8 RGB pixels → (14, binbits) bool.

    Fractions of: black pixels (luma < 32), grey pixels (saturation < 85, not black), then
    6 hue bins of faint colour (85 ≤ s < 170) and 6 of bright colour (s > 170), the hue bins
    normalised by the coloured-pixel count. Each fraction f is quantised to
    v = min(2^binbits − 1, ⌊f·2^binbits⌋) and written with imagehash's bit code.
    """
    return _colorhash_bits(frozen(planes(pixels).colours.counts, np.int64), binbits)


@njit(cache=True, nogil=True)
def _hue_histogram_values(counts: np.ndarray) -> np.ndarray:
    """(COLOUR_CLASSES, HUE_CODES) int64 counts → (HUE_BINS + 1,) uint8 (``hue_histogram``)."""
    hues = np.zeros(HUE_CODES, np.int64)
    for c in range(counts.shape[0]):
        hues += counts[c]
    saturated = hues[:HUE_BINS].sum()
    out = np.empty(HUE_BINS + 1, np.uint8)
    for k in range(HUE_BINS):
        out[k] = np.round(hues[k] / max(saturated, 1) * 255)
    out[HUE_BINS] = min(255, np.round(saturated / hues.sum() * 255))
    return out


def hue_histogram(pixels: np.ndarray) -> bytes:
    """Hue histogram of the saturated pixels only (OpenCV HSV: s > 0.25·255 and
    v > 0.2·255): ``HUE_BINS`` bytes summing to about 255, then one byte with the saturated
    share of the image (×255, rounded).

    phash reads grey levels and colorhash spreads its bits over the whole image, so neither
    tells a blue object from a green one once it covers a small part of the frame (on
    one-object ShapesWorld scenes every recolouring passes both). Normalising over the
    saturated pixels alone makes the histogram's total-variation distance ≈ 1 for a
    recolouring and ≤ 0.1 for resize, re-encode, crop and shift edits.
    """
    return _hue_histogram_values(frozen(planes(pixels).colours.counts, np.int64)).tobytes()


def hue_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Total-variation distance in [0, 1] between rows of two (n, HUE_BINS + 1) uint8
    histograms; pairs where either image has (almost) no saturated pixels get 0, since
    their hue says nothing."""
    ha, hb = a[:, :HUE_BINS].astype(np.int32), b[:, :HUE_BINS].astype(np.int32)
    tv = np.abs(ha - hb).sum(axis=1) / (2 * 255)
    coloured = (a[:, HUE_BINS] > 0) & (b[:, HUE_BINS] > 0)
    return np.where(coloured, tv, 0.0)


def image_hashes(pixels: np.ndarray, shared: Planes | None = None) -> dict[str, bytes]:
    """All perceptual hashes of one decode: phash8 (8 B), phash12 (18 B), colorhash (42 bits
    padded to 6 B), huehist (19 B), ladder (``crop_ladder``, 180 B). One luma for the phashes
    and the ladder, one colour-table lookup for colorhash and the hue histogram, both from
    ``shared`` (the pixels' ``planes``, computed here when not given)."""
    p = planes(pixels) if shared is None else shared
    colorhash, huehist = colour_hash_bytes(frozen(p.colours.counts, np.int64))
    return {
        "phash8": phash_bytes(p.luma, 8),
        "phash12": phash_bytes(p.luma, 12),
        "colorhash": colorhash.tobytes(),
        "huehist": huehist.tobytes(),
        "ladder": ladder_bytes(p.luma),
    }
