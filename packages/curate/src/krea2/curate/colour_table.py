"""Colour classes of every 24-bit RGB colour, tabulated once, so that colorhash and the
saturated-hue histogram are one table lookup and one histogram per image.

Both hashes count pixels by classes that depend on the pixel's colour alone: colorhash by
Pillow's luma and HSV (black, grey, faint or bright colour of one of 6 hues), the hue
histogram by OpenCV's HSV (one of 18 hues when saturated and not dark). Converting each image
to HSV twice costs ~1 ms at 256 px; instead the table holds, for all 2^24 colours, the code
``colour_class · HUE_CODES + hue_code`` computed by those same conversions (so the counts
are those of the conversions by construction, not an approximation). Building it converts
2^24 pixels once per process (~1-3 s, 16 MiB kept); a lookup is one gather per run of one
colour (``pixel_pass``).

The same lookup also marks the white (every channel ≥ 250) and black (every channel ≤ 5)
colours, so the white- and black-ratio filters read their counts from it for free.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import cv2
import numpy as np
from numba import njit
from PIL import Image

# colorhash classes: 0 black (luma < 32), 1 grey (s < 85), 2-7 faint colour (85 ≤ s < 170)
# by hue bin, 8-13 bright colour (s > 170) by hue bin, 14 saturation exactly 170 (imagehash
# counts it as coloured but puts it in neither hue histogram).
BLACK, GREY, FAINT, BRIGHT, SAT_170 = 0, 1, 2, 8, 14
COLOUR_CLASSES = 15
HUE_BINS = 18  # hue histogram bins of the saturated pixels
HUE_CODES = HUE_BINS + 1  # the last code: not saturated or too dark
MIN_SATURATION, MIN_VALUE = 0.25, 0.2  # of 255, the hue histogram's "saturated" test
# Extremes, a third tabulated property: 0 neither, 1 white, 2 black (the filters' bounds).
NEITHER, WHITE, BLACK_PIXEL = 0, 1, 2
EXTREMES = 3
WHITE_MIN, BLACK_MAX = 250, 5

# imagehash splits Pillow's 8-bit hue into 6 bins with edges linspace(0, 255, 7), last closed.
_HUE6 = np.minimum(np.searchsorted(np.linspace(0, 255, 7), np.arange(256), "right") - 1, 5)


def colour_class(luma: np.ndarray, hsv: np.ndarray) -> np.ndarray:
    """colorhash class (0..14) per pixel from Pillow's ``L`` and ``HSV`` of the same pixels."""
    s = hsv[..., 1]
    hue = _HUE6[hsv[..., 0]]
    cls = np.select([s < 85, s < 170, s == 170], [GREY, FAINT + hue, SAT_170], BRIGHT + hue)
    return np.where(luma < 32, BLACK, cls)


def hue_code(rgb: np.ndarray) -> np.ndarray:
    """Hue-histogram code per pixel of (..., 3) uint8 RGB: 0..17 by OpenCV hue, or 18."""
    hsv = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2HSV)
    saturated = (hsv[..., 1] > 255 * MIN_SATURATION) & (hsv[..., 2] > 255 * MIN_VALUE)
    return np.where(saturated, hsv[..., 0].astype(np.int64) * HUE_BINS // 180, HUE_BINS)


def extreme(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB → WHITE, BLACK_PIXEL or NEITHER per pixel."""
    white = rgb.min(axis=-1) >= WHITE_MIN
    black = rgb.max(axis=-1) <= BLACK_MAX
    return np.where(white, WHITE, np.where(black, BLACK_PIXEL, NEITHER))


@cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(2^24,) uint8 index per colour (indexed by ``r | g << 8 | b << 16``) into the second
    array, the distinct codes ``(colour_class · HUE_CODES + hue_code) · EXTREMES + extreme``
    (about 110 of the 855 possible occur, so one byte per colour keeps the table at 16 MiB)."""
    codes = np.empty(1 << 24, np.uint16)
    plane = np.empty((256, 256, 3), np.uint8)  # one blue level: r along x, g along y
    plane[..., 0] = np.arange(256)[None, :]
    plane[..., 1] = np.arange(256)[:, None]
    step = 16  # blue levels per conversion: 1M pixels, a few MiB of temporaries
    block = np.tile(plane, (step, 1, 1))
    for b0 in range(0, 256, step):
        block[..., 2] = np.repeat(np.arange(b0, b0 + step, dtype=np.uint8), 256)[:, None]
        img = Image.fromarray(block)
        cls = colour_class(np.asarray(img.convert("L")), np.asarray(img.convert("HSV")))
        code = (cls * HUE_CODES + hue_code(block)) * EXTREMES + extreme(block)
        codes[b0 << 16 : (b0 + step) << 16] = code.ravel()
    n_codes = COLOUR_CLASSES * HUE_CODES * EXTREMES
    present = np.flatnonzero(np.bincount(codes, minlength=n_codes))
    assert len(present) <= 256, len(present)
    index = np.zeros(n_codes, np.uint8)
    index[present] = np.arange(len(present))
    table = index[codes]
    table.setflags(write=False)
    present = present.astype(np.int64)
    present.setflags(write=False)
    return table, present


def index_table() -> np.ndarray:
    """(2^24,) uint8: each colour's index, ``index_table()[r | g << 8 | b << 16]``, into
    the distinct codes that ``colour_stats`` expands (built on first use, then kept)."""
    return _tables()[0]


@dataclass(frozen=True)
class ColourStats:
    """What the colour lookup counts in one image: ``counts`` (COLOUR_CLASSES, HUE_CODES)
    int64 pixels per colorhash class and hue code; ``white``/``black``: pixels with every
    channel ≥ 250 / ≤ 5; ``pixels``: all pixels."""

    counts: np.ndarray
    white: int
    black: int
    pixels: int


def present_codes() -> np.ndarray:
    """(k,) int64 read-only: the code behind each ``index_table`` value."""
    return _tables()[1]


@njit(cache=True, nogil=True)
def code_counts(per_index: np.ndarray, present: np.ndarray):
    """(256,) int64 pixel counts per ``index_table`` value and ``present_codes()`` →
    ``counts`` (COLOUR_CLASSES, HUE_CODES) int64, ``white`` and ``black`` pixel counts."""
    counts = np.zeros(COLOUR_CLASSES * HUE_CODES, np.int64)
    white = 0
    black = 0
    for k in range(present.size):
        n = per_index[k]
        counts[present[k] // EXTREMES] += n
        extreme = present[k] % EXTREMES
        if extreme == WHITE:
            white += n
        elif extreme == BLACK_PIXEL:
            black += n
    return counts.reshape(COLOUR_CLASSES, HUE_CODES), white, black
