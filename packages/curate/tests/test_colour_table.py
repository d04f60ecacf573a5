"""The tabulated colour classes count exactly what converting each image would count."""

from __future__ import annotations

import numpy as np
from PIL import Image

from krea2.curate.colour_table import (
    COLOUR_CLASSES,
    HUE_CODES,
    colour_class,
    hue_code,
)
from krea2.curate.decode import decode
from krea2.curate.planes import planes


def colour_counts(pixels: np.ndarray) -> np.ndarray:
    """The table lookup's counts, as the analysis computes them (``pixel_pass``)."""
    return planes(pixels).colours.counts


def _direct_counts(pixels: np.ndarray) -> np.ndarray:
    img = Image.fromarray(pixels)
    cls = colour_class(np.asarray(img.convert("L")), np.asarray(img.convert("HSV")))
    codes = cls * HUE_CODES + hue_code(pixels)
    return np.bincount(codes.ravel(), minlength=COLOUR_CLASSES * HUE_CODES).reshape(
        COLOUR_CLASSES, HUE_CODES
    )


def test_counts_equal_converting_the_image_on_real_photos(real_photos):
    for name, data in real_photos.items():
        pixels = decode(data).pixels
        assert (colour_counts(pixels) == _direct_counts(pixels)).all(), name


def test_counts_equal_converting_the_image_on_noise_and_pure_colours():
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    assert (colour_counts(noise) == _direct_counts(noise)).all()
    # Hue and saturation boundaries: every pair of extreme channels with a third level.
    levels = np.arange(256, dtype=np.uint8)
    edges = np.stack(np.meshgrid(levels, [0, 85, 170, 255], [0, 255], indexing="ij"), -1)
    edges = edges.reshape(64, -1, 3).astype(np.uint8)
    assert (colour_counts(edges) == _direct_counts(edges)).all()
