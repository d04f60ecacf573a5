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
from PIL import Image

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


def _grey(pixels: np.ndarray) -> Image.Image:
    # Pillow's ITU-R 601-2 luma, the same conversion imagehash uses.
    return Image.fromarray(pixels).convert("L")


def phash_bits(pixels: np.ndarray, hash_size: int = 12) -> np.ndarray:
    """Perceptual hash of (h, w, 3) uint8 RGB pixels → (hash_size, hash_size) bool.

    Grey → Lanczos resize to (4·hash_size)² → 2-D DCT-II → the top-left hash_size² block
    (DC included) thresholded at its median.
    """
    return _phash_from_grey(_grey(pixels), hash_size)


def _phash_from_grey(grey: Image.Image, hash_size: int) -> np.ndarray:
    side = hash_size * PHASH_HIGHFREQ_FACTOR
    small = np.asarray(grey.resize((side, side), Image.Resampling.LANCZOS), dtype=np.float64)
    coeffs = scipy.fft.dct(scipy.fft.dct(small, axis=0), axis=1)[:hash_size, :hash_size]
    return coeffs > np.median(coeffs)


# colorhash bins: imagehash splits hue 0..255 into 6 equal bins with edges linspace(0, 255, 7),
# the last bin closed. A lookup table gives each 8-bit hue its bin.
_HUE_BIN = np.minimum(np.searchsorted(np.linspace(0, 255, 7), np.arange(256), "right") - 1, 5)


# Saturation classes: 1 grey (s < 85), 2 faint (85 ≤ s < 170), 4 exactly 170 (in neither
# colour bin, as in imagehash), 3 bright (s > 170); class 0 is black (luma < 32).
_SAT_CLASS = np.select(
    [np.arange(256) < 85, np.arange(256) < 170, np.arange(256) == 170], [1, 2, 4], 3
).astype(np.int32)


def _colorhash_from(luma: np.ndarray, hsv: np.ndarray, binbits: int) -> np.ndarray:
    """colorhash from Pillow's (h, w) luma and (h, w, 3) HSV of the same pixels."""
    hue = hsv[:, :, 0].ravel().astype(np.int32)
    cls = np.where(luma.ravel() < 32, 0, _SAT_CLASS[hsv[:, :, 1].ravel()])
    # One pass: counts per (class, hue), then the hue counts grouped into the 6 bins.
    counts = np.bincount(cls * 256 + hue, minlength=5 * 256).reshape(5, 256)
    binned = np.zeros((5, 6), np.int64)
    np.add.at(binned, (slice(None), _HUE_BIN), counts)
    n = luma.size
    coloured = max(1, int(counts[2:].sum()))
    top = 2**binbits
    fractions = [counts[0].sum() / n, counts[1].sum() / n]
    fractions += list(binned[2] / coloured) + list(binned[3] / coloured)
    values = [min(top - 1, int(f * top)) for f in fractions]
    bits = [
        [(v // 2 ** (binbits - i - 1)) % 2 ** (binbits - i) > 0 for i in range(binbits)]
        for v in values
    ]
    return np.asarray(bits, dtype=bool)


def colorhash_bits(pixels: np.ndarray, binbits: int = 3) -> np.ndarray:
    """Colour hash of (h, w, 3) uint8 RGB pixels → (14, binbits) bool.

    Fractions of: black pixels (luma < 32), grey pixels (saturation < 85, not black), then
    6 hue bins of faint colour (85 ≤ s < 170) and 6 of bright colour (s > 170), the hue bins
    normalised by the coloured-pixel count. Each fraction f is quantised to
    v = min(2^binbits − 1, ⌊f·2^binbits⌋) and written with imagehash's bit code.
    """
    img = Image.fromarray(pixels)
    return _colorhash_from(np.asarray(img.convert("L")), np.asarray(img.convert("HSV")), binbits)


HUE_BINS = 18


def hue_histogram(
    pixels: np.ndarray, min_saturation: float = 0.25, min_value: float = 0.2
) -> bytes:
    """Hue histogram of the saturated pixels only: ``HUE_BINS`` bytes summing to about 255,
    then one byte with the saturated share of the image (×255, rounded).

    phash reads grey levels and colorhash spreads its bits over the whole image, so neither
    tells a blue object from a green one once it covers a small part of the frame (on
    one-object ShapesWorld scenes every recolouring passes both). Normalising over the
    saturated pixels alone makes the histogram's total-variation distance ≈ 1 for a
    recolouring and ≤ 0.1 for resize, re-encode, crop and shift edits.
    """
    import cv2

    hsv = cv2.cvtColor(np.ascontiguousarray(pixels, dtype=np.uint8), cv2.COLOR_RGB2HSV)
    mask = (hsv[..., 1] > 255 * min_saturation) & (hsv[..., 2] > 255 * min_value)
    counts = np.bincount(hsv[..., 0][mask].astype(np.int64) * HUE_BINS // 180,
                         minlength=HUE_BINS)  # fmt: skip
    share = counts / max(int(counts.sum()), 1)
    hist = np.round(share * 255).astype(np.uint8)
    saturated = np.uint8(min(255, round(float(mask.mean()) * 255)))
    return hist.tobytes() + bytes([saturated])


def hue_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Total-variation distance in [0, 1] between rows of two (n, HUE_BINS + 1) uint8
    histograms; pairs where either image has (almost) no saturated pixels get 0, since
    their hue says nothing."""
    ha, hb = a[:, :HUE_BINS].astype(np.int32), b[:, :HUE_BINS].astype(np.int32)
    tv = np.abs(ha - hb).sum(axis=1) / (2 * 255)
    coloured = (a[:, HUE_BINS] > 0) & (b[:, HUE_BINS] > 0)
    return np.where(coloured, tv, 0.0)


def image_hashes(pixels: np.ndarray) -> dict[str, bytes]:
    """All perceptual hashes of one decode: phash8 (8 B), phash12 (18 B), colorhash (42 bits
    padded to 6 B), huehist (19 B). The grey conversion is shared between the two phashes."""
    img = Image.fromarray(pixels)
    grey = img.convert("L")  # shared by both phashes and colorhash
    colour = _colorhash_from(np.asarray(grey), np.asarray(img.convert("HSV")), 3)
    return {
        "phash8": pack_bits(_phash_from_grey(grey, 8)),
        "phash12": pack_bits(_phash_from_grey(grey, 12)),
        "colorhash": pack_bits(colour),
        "huehist": hue_histogram(pixels),
    }
