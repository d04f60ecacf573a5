"""Our integer-matrix LANCZOS resize equals Pillow's pixel for pixel."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image

from krea2.curate.resample import lanczos_resize, pass_weights, vertical_first


def _pillow(grey: np.ndarray, out_w: int, out_h: int) -> np.ndarray:
    return np.asarray(Image.fromarray(grey).resize((out_w, out_h), Image.Resampling.LANCZOS))


def _content(rng: np.random.Generator, h: int, w: int, kind: int) -> np.ndarray:
    """Noise, blurred noise (smooth, like photos) or black/white edges (max overshoot)."""
    noise = rng.integers(0, 256, (h, w), dtype=np.uint8)
    if kind == 1:
        return cv2.GaussianBlur(noise, (0, 0), 2)
    if kind == 2:
        return (noise > 127).astype(np.uint8) * 255
    return noise


def test_equals_pillow_on_random_sizes_both_pass_orders_and_enlargements():
    rng = np.random.default_rng(0)
    orders = set()
    for trial in range(300):
        h, w = (int(v) for v in rng.integers(1, 300, 2))
        out_w, out_h = (int(rng.choice([1, 7, 32, 48, int(rng.integers(1, 400))])) for _ in "xy")
        grey = _content(rng, h, w, trial % 3)
        orders.add(vertical_first(h, w, out_h, out_w))
        ours = lanczos_resize(grey, out_w, out_h)
        assert (ours == _pillow(grey, out_w, out_h)).all(), (h, w, out_h, out_w)
    assert orders == {True, False}


@pytest.mark.parametrize("shape", [(256, 256), (192, 256), (256, 171), (256, 85), (31, 40)])
@pytest.mark.parametrize("side", [32, 48])
def test_equals_pillow_at_the_phash_sizes(shape, side):
    grey = _content(np.random.default_rng(side), *shape, 1)
    assert (lanczos_resize(grey, side, side) == _pillow(grey, side, side)).all()


def test_weights_are_fixed_point_and_sum_to_one():
    w = pass_weights(256, 48)
    assert w.shape == (48, 256)
    assert (w == np.round(w)).all()
    # Each row sums to 2^22 up to the rounding of its ~33 taps.
    assert np.abs(w.sum(axis=1) - 2**22).max() <= 33
