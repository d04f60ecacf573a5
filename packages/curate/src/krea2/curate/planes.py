"""What the cheap filters and the hashes read besides the pixels, computed once per image.

The filters want OpenCV's grey, the three channel histograms and the white/black pixel
counts; the hashes want Pillow's luma and the colour-class counts. One RGBA copy of the
pixels serves the colour-table keys and, with the column phase in its fourth byte, the
channel histograms (``histogram``); the white/black counts come out of the same table lookup
as the colour classes (``colour_table``).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from krea2.curate.colour_table import ColourStats, colour_stats, keys_of_rgba
from krea2.curate.histogram import channel_histograms_rgbp, phase_plane, with_phase

# Pillow's RGB → L: (19595 r + 38470 g + 7471 b + 2^15) >> 16. Divided by 2^16 the weights
# and every partial sum are multiples of 2^-16 below 2^8, i.e. 24-bit floats: cv2.transform
# computes them exactly in float32, and the floor is Pillow's shift.
_PILLOW_LUMA = np.array([[19595, 38470, 7471, 1 << 15]], np.float32) / np.float32(1 << 16)


def pillow_luma_f64(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB → (h, w) float64 Pillow ``L`` (ITU-R 601-2 luma, the conversion
    imagehash uses), equal to ``Image.fromarray(pixels).convert("L")`` level for level."""
    frac = cv2.transform(pixels.astype(np.float32), _PILLOW_LUMA)
    return np.floor(frac.reshape(pixels.shape[:2]), dtype=np.float64)


def pillow_luma(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB → (h, w) uint8 Pillow ``L`` (OpenCV's grey rounds differently
    for a few colours)."""
    return pillow_luma_f64(pixels).astype(np.uint8)


@dataclass(frozen=True)
class Planes:
    """Shared intermediates of one image's (h, w, 3) uint8 RGB pixels.

    ``grey``: (h, w) uint8 OpenCV luma (filters). ``hists``: (3, 256) float64 pixel counts
    per channel level. ``colours``: colour-class counts and white/black pixel counts.
    ``luma``: (h, w) float64 Pillow luma (phash).
    """

    grey: np.ndarray
    hists: np.ndarray
    colours: ColourStats
    luma: np.ndarray


def planes(pixels: np.ndarray) -> Planes:
    """Compute every shared intermediate of (h, w, 3) uint8 RGB ``pixels``."""
    px = np.ascontiguousarray(pixels)
    h, w = px.shape[:2]
    rgba = cv2.cvtColor(px, cv2.COLOR_RGB2RGBA)
    keys = keys_of_rgba(rgba)
    return Planes(
        grey=cv2.cvtColor(px, cv2.COLOR_RGB2GRAY),
        hists=channel_histograms_rgbp(with_phase(rgba)),
        colours=colour_stats(keys, phase_plane(h, w)),
        luma=pillow_luma_f64(px),
    )
