"""The shared per-image intermediates equal what each filter and hash would compute alone."""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image
from threadpoolctl import threadpool_limits

from krea2.curate.colour_table import colour_keys, colour_stats
from krea2.curate.decode import decode
from krea2.curate.filters.extremes import black_ratio, white_ratio
from krea2.curate.histogram import channel_histograms_rgbp, index_histogram, with_phase
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


def test_channel_and_index_histograms_are_exact_counts(real_photos):
    for name, px in _images(real_photos).items():
        rgba = cv2.cvtColor(px, cv2.COLOR_RGB2RGBA)
        hists = channel_histograms_rgbp(with_phase(rgba))
        direct = [np.bincount(px[..., c].ravel(), minlength=256) for c in range(3)]
        assert (hists == np.stack(direct)).all(), name
        grey = cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)
        assert (index_histogram(grey) == np.bincount(grey.ravel(), minlength=256)).all(), name


def test_index_histogram_counts_past_float32_exactness():
    big = np.zeros((4096, 4097), np.uint8)
    big[0, :3] = 7
    hist = index_histogram(big)
    assert hist[0] == big.size - 3 and hist[7] == 3


def test_white_and_black_counts_come_from_the_colour_lookup(real_photos):
    for name, px in _images(real_photos).items():
        stats = colour_stats(colour_keys(px))
        assert stats.white / stats.pixels == white_ratio(px), name
        assert stats.black / stats.pixels == black_ratio(px), name
    extremes = colour_stats(colour_keys(_images({})["extremes"]))
    assert (extremes.white, extremes.black) == (15 * 40, 15 * 40)  # rows 0-14; 15-19, 30-39


def test_planes_match_the_standalone_conversions(real_photos):
    for name, px in _images(real_photos).items():
        p = planes(px)
        assert (p.grey == cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)).all(), name
        assert (p.luma == np.asarray(Image.fromarray(px).convert("L"))).all(), name
        assert p.colours.pixels == px.shape[0] * px.shape[1]


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
