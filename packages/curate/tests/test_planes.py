"""The shared per-image intermediates equal what each filter and hash would compute alone."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image
from threadpoolctl import threadpool_limits

from krea2.curate.decode import decode
from krea2.curate.filters.extremes import black_ratio, white_ratio
from krea2.curate.pixel_pass import count_within
from krea2.curate.planes import pillow_luma, planes
from krea2.curate.threads import pool_threads, single_threaded


def _images(real_photos) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {name: decode(data).pixels for name, data in real_photos.items()}
    out["noise"] = rng.integers(0, 256, (37, 53, 3), np.uint8)
    out["flat"] = np.full((64, 48, 3), (200, 30, 90), np.uint8)
    extremes = np.zeros((40, 40, 3), np.uint8)
    extremes[:10] = 255
    extremes[10:15] = (250, 251, 252)
    extremes[15:20] = (5, 0, 3)
    extremes[20:25] = (249, 255, 255)
    extremes[25:30] = (6, 0, 0)
    out["extremes"] = extremes
    return out


def test_pillow_luma_equals_pillow_for_every_colour():
    every = np.arange(1 << 24, dtype=np.uint32).view(np.uint8).reshape(4096, 4096, 4)[..., :3]
    every = np.ascontiguousarray(every)
    assert (pillow_luma(every) == np.asarray(Image.fromarray(every).convert("L"))).all()


def test_opencv_grey_equals_opencv_for_every_colour():
    every = np.arange(1 << 24, dtype=np.uint32).view(np.uint8).reshape(4096, 4096, 4)[..., :3]
    every = np.ascontiguousarray(every)
    assert (planes(every).grey == cv2.cvtColor(every, cv2.COLOR_RGB2GRAY)).all()


def test_channel_histograms_and_line_sums_are_exact(real_photos):
    for name, px in _images(real_photos).items():
        p = planes(px)
        direct = [np.bincount(px[..., c].ravel(), minlength=256) for c in range(3)]
        assert (p.hists == np.stack(direct)).all(), name
        grey = cv2.cvtColor(px, cv2.COLOR_RGB2GRAY).astype(np.float64)
        for axis, mean, std in (
            (1, p.lines.row_mean, p.lines.row_std),
            (0, p.lines.col_mean, p.lines.col_std),
        ):
            np.testing.assert_allclose(mean, grey.mean(axis=axis), rtol=1e-12, err_msg=name)
            np.testing.assert_allclose(std, grey.std(axis=axis), atol=1e-6, err_msg=name)


def test_white_and_black_counts_come_from_the_colour_lookup(real_photos):
    for name, px in _images(real_photos).items():
        stats = planes(px).colours
        assert stats.white / stats.pixels == white_ratio(px), name
        assert stats.black / stats.pixels == black_ratio(px), name
        assert stats.white == ((px >= 250).all(axis=2)).sum(), name
    extremes = planes(_images({})["extremes"]).colours
    assert (extremes.white, extremes.black) == (15 * 40, 15 * 40)  # rows 0-14; 15-19, 30-39


def test_count_within_equals_opencv_in_range(real_photos):
    rng = np.random.default_rng(1)
    for name, px in _images(real_photos).items():
        for _ in range(5):
            lo = rng.integers(0, 256, 3).astype(np.uint8)
            hi = np.maximum(lo, rng.integers(0, 256, 3)).astype(np.uint8)
            mask = cv2.inRange(px, lo.astype(float), hi.astype(float))
            assert count_within(px, lo, hi) == cv2.countNonZero(mask), (name, lo, hi)


def test_planes_match_the_standalone_conversions(real_photos):
    for name, px in _images(real_photos).items():
        p = planes(px)
        assert (p.grey == cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)).all(), name
        assert (p.luma == np.asarray(Image.fromarray(px).convert("L"))).all(), name
        assert p.colours.pixels == px.shape[0] * px.shape[1]
    strided = _images({})["noise"][:, ::2]  # not C-contiguous: copied, same result
    assert (planes(strided).luma == pillow_luma(np.ascontiguousarray(strided))).all()


def test_single_threaded_sets_opencv_and_blas():
    before = pool_threads()
    try:
        single_threaded()
        threads = pool_threads()
        assert threads["opencv"] == 1
        assert threads["blas"] == 1  # numpy's OpenBLAS is found and set
        assert threads.get("openmp") == before.get("openmp")  # torch's pool is left alone
    finally:  # the rest of this pytest process keeps its settings
        cv2.setNumThreads(before["opencv"])
        threadpool_limits(limits=before["blas"], user_api="blas")


def test_planes_scores_equal_direct_numpy_and_opencv(real_photos):
    for name, px in _images(real_photos).items():
        p = planes(px)
        n = px.shape[0] * px.shape[1]
        entropy = 0.0
        for c in range(3):
            q = np.bincount(px[..., c].ravel(), minlength=256) / n
            entropy -= (q[q > 0] * np.log2(q[q > 0])).sum() / 3
        assert p.entropy == pytest.approx(entropy, abs=1e-12), name
        centre = np.median(px.reshape(-1, 3), axis=0)
        mask = (np.abs(px.astype(np.float64) - centre) <= 8).all(axis=2)
        assert p.flat_ratio == mask.mean(), name
        lap = cv2.Laplacian(cv2.cvtColor(px, cv2.COLOR_RGB2GRAY), cv2.CV_64F)
        h, w = lap.shape
        if h >= 16 and w >= 16:
            tiles = lap[: h // 8 * 8, : w // 8 * 8].reshape(8, h // 8, 8, w // 8)
            assert p.laplacian_var == pytest.approx(np.median(tiles.var(axis=(1, 3))), rel=1e-9)
