"""The compiled Laplacian tiles equal OpenCV's Laplacian cut into tiles."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from krea2.curate.decode import decode
from krea2.curate.pixel_pass import TILES, channel_medians, laplacian_tiles


def _opencv_tiles(grey: np.ndarray) -> np.ndarray:
    lap = cv2.Laplacian(grey, cv2.CV_64F)
    h, w = lap.shape
    th, tw = h // TILES, w // TILES
    if th < 2 or tw < 2:
        return np.array([[lap.var()]])
    tiles = lap[: th * TILES, : tw * TILES].reshape(TILES, th, TILES, tw)
    return tiles.var(axis=(1, 3))


def test_tiles_equal_opencv_on_real_photos(real_photos):
    for name, data in real_photos.items():
        grey = cv2.cvtColor(decode(data).pixels, cv2.COLOR_RGB2GRAY)
        np.testing.assert_allclose(
            laplacian_tiles(grey), _opencv_tiles(grey), rtol=1e-9, atol=1e-9, err_msg=name
        )


@pytest.mark.parametrize(
    "shape", [(1, 1), (1, 7), (7, 1), (2, 2), (15, 40), (16, 16), (17, 33), (255, 256)]
)
def test_tiles_equal_opencv_at_every_size_and_border(shape):
    grey = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    np.testing.assert_allclose(laplacian_tiles(grey), _opencv_tiles(grey), rtol=1e-9, atol=1e-9)


def test_channel_medians_equal_numpy_median():
    rng = np.random.default_rng(2)
    for shape in [(1, 1, 3), (1, 2, 3), (5, 7, 3), (64, 33, 3)]:
        px = rng.integers(0, 256, shape, dtype=np.uint8)
        hists = np.stack([np.bincount(px[..., c].ravel(), minlength=256) for c in range(3)])
        expected = np.median(px.reshape(-1, 3), axis=0)
        assert (channel_medians(hists.astype(np.int64)) == expected).all(), shape
