"""Content hashes: md5 of the bytes, perceptual phash (8×8 and 12×12), colorhash, and a
saturated-hue histogram.

The perceptual hashes follow imagehash's definitions bit for bit, so a hash computed here
equals ``imagehash.phash(Image.fromarray(pixels), hash_size)`` and
``imagehash.colorhash(Image.fromarray(pixels), binbits)`` on the same pixels. They read the
reduced-scale pixels of the one decode, which is what makes them cheap; imagehash users
typically hash the full-resolution image, so hashes agree with theirs only up to that
resize (tested to stay within a few bits on real photos).
"""

from __future__ import annotations

import hashlib

import numpy as np
import scipy.fft

from krea2.curate.colour_table import BLACK, BRIGHT, FAINT, GREY, HUE_BINS, SAT_170, colour_counts
from krea2.curate.planes import Planes, pillow_luma, planes
from krea2.curate.resample import lanczos_resize

PHASH_HIGHFREQ_FACTOR = 4


def md5(data: bytes) -> str:
    """Hex md5 of the file bytes (exact duplicates)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def pack_bits(bits: np.ndarray) -> bytes:
    """Bool array (any shape, row-major) → bytes, most significant bit first.

    Matches imagehash's hex strings: ``pack_bits(b).hex() == str(ImageHash(b))`` whenever
    the bit count is a multiple of 8.
    """
    return np.packbits(np.asarray(bits, dtype=bool).ravel()).tobytes()


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
    return _phash_from_grey(pillow_luma(pixels), hash_size)


def _phash_from_grey(grey: np.ndarray, hash_size: int) -> np.ndarray:
    """(h, w) luma, uint8 or its float64 copy → (hash_size, hash_size) bool."""
    side = hash_size * PHASH_HIGHFREQ_FACTOR
    small = lanczos_resize(grey, side, side).astype(np.float64)
    coeffs = scipy.fft.dct(scipy.fft.dct(small, axis=0), axis=1)[:hash_size, :hash_size]
    return coeffs > np.median(coeffs)


def _colorhash_from(counts: np.ndarray, binbits: int) -> np.ndarray:
    """colorhash from ``colour_table.colour_counts`` of the pixels: (14, binbits) bool."""
    per_class = counts.sum(axis=1)
    n = int(per_class.sum())
    coloured = max(1, int(per_class[FAINT:].sum()))  # faint, bright and s == 170
    top = 2**binbits
    fractions = [per_class[BLACK] / n, per_class[GREY] / n]
    fractions += list(per_class[FAINT:BRIGHT] / coloured)
    fractions += list(per_class[BRIGHT:SAT_170] / coloured)
    values = np.minimum(top - 1, (np.array(fractions) * top).astype(np.int64))
    # imagehash's bit code: bit i of value v is (v // 2^(binbits-i-1)) % 2^(binbits-i) > 0
    i = np.arange(binbits)
    return (values[:, None] // 2 ** (binbits - i - 1)) % 2 ** (binbits - i) > 0


def colorhash_bits(pixels: np.ndarray, binbits: int = 3) -> np.ndarray:
    """Colour hash of (h, w, 3) uint8 RGB pixels → (14, binbits) bool.

    Fractions of: black pixels (luma < 32), grey pixels (saturation < 85, not black), then
    6 hue bins of faint colour (85 ≤ s < 170) and 6 of bright colour (s > 170), the hue bins
    normalised by the coloured-pixel count. Each fraction f is quantised to
    v = min(2^binbits − 1, ⌊f·2^binbits⌋) and written with imagehash's bit code.
    """
    return _colorhash_from(colour_counts(pixels), binbits)


def _hue_histogram_from(counts: np.ndarray) -> bytes:
    hues = counts.sum(axis=0)
    saturated = int(hues[:HUE_BINS].sum())
    share = hues[:HUE_BINS] / max(saturated, 1)
    hist = np.round(share * 255).astype(np.uint8)
    return hist.tobytes() + bytes([min(255, round(saturated / int(hues.sum()) * 255))])


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
    return _hue_histogram_from(colour_counts(pixels))


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
    padded to 6 B), huehist (19 B). One luma for both phashes, one colour-table lookup for
    colorhash and the hue histogram, both from ``shared`` (the pixels' ``planes``, computed
    here when not given)."""
    p = planes(pixels) if shared is None else shared
    grey, counts = p.luma, p.colours.counts
    return {
        "phash8": pack_bits(_phash_from_grey(grey, 8)),
        "phash12": pack_bits(_phash_from_grey(grey, 12)),
        "colorhash": pack_bits(_colorhash_from(counts, 3)),
        "huehist": _hue_histogram_from(counts),
    }
