"""``color_labels`` reads pixels through a lookup table: it must equal measuring the distance
to every palette colour, ties and the distance bound included."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.shapes.detect import COLOR_DISTANCE, _nearest_colors, color_labels
from krea2.curate.shapes.spec import COLORS


def _measured(pixels: np.ndarray, max_distance: float) -> np.ndarray:
    return _nearest_colors(pixels.reshape(-1, 3), max_distance).reshape(pixels.shape[:2])


@pytest.mark.parametrize("max_distance", [COLOR_DISTANCE, 0.0, 30.5, 500.0])
def test_the_table_equals_measuring_every_distance(max_distance):
    rng = np.random.default_rng(0)
    palette = np.array(list(COLORS.values()), np.int64)
    # random colours, and colours near the palette and near the bound's edge
    near = palette[rng.integers(0, len(palette), 4096)] + rng.integers(-75, 76, (4096, 3))
    pixels = np.concatenate([rng.integers(0, 256, (4096, 3)), np.clip(near, 0, 255)])
    pixels = pixels.astype(np.uint8).reshape(128, 64, 3)
    labels = color_labels(pixels, max_distance)
    assert labels.shape == (128, 64)
    assert np.array_equal(labels, _measured(pixels, max_distance))


def test_palette_colours_read_as_themselves_and_ties_as_the_first_colour():
    palette = np.array(list(COLORS.values()), np.int64)
    assert color_labels(palette.astype(np.uint8)[None]).tolist() == [list(range(len(palette)))]
    # colours exactly as far from two palette colours read as the first of them (argmin's)
    grid = np.stack(np.meshgrid(*[np.arange(0, 256, 3)] * 3, indexing="ij"), -1).reshape(-1, 3)
    d2 = ((grid[:, None] - palette[None]) ** 2).sum(-1)
    nearest2 = np.sort(d2, axis=1)
    tie = (nearest2[:, 0] == nearest2[:, 1]) & (nearest2[:, 0] <= 200**2)
    assert tie.sum() > 0
    labels = color_labels(grid[tie].astype(np.uint8)[None], 200.0)[0]
    assert np.array_equal(labels, d2[tie].argmin(axis=1))


def test_non_uint8_pixels_are_measured_alike():
    pixels = np.random.default_rng(1).integers(0, 256, (16, 16, 3)).astype(np.float32)
    assert np.array_equal(color_labels(pixels), _measured(pixels, COLOR_DISTANCE))
