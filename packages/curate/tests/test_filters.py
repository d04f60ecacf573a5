"""Each cheap filter: its score moves the right way and its verdict names the reason."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from krea2.curate.config import CurateConfig, StageThresholds
from krea2.curate.decode import DecodedImage, decode
from krea2.curate.filters import CHEAP_FILTERS, run_cheap_filters
from krea2.curate.filters.border import border_fraction
from krea2.curate.filters.complexity import edge_density
from krea2.curate.filters.entropy import rgb_entropy
from krea2.curate.filters.extremes import black_ratio, white_ratio
from krea2.curate.filters.flat import flat_ratio
from krea2.curate.filters.laplacian import laplacian_variance
from krea2.curate.pixel_pass import neighbour_correlation
from krea2.curate.planes import planes
from krea2.curate.shapes import Scene, ShapeObject, render

T = StageThresholds()


def _image(pixels: np.ndarray, width: int | None = None, height: int | None = None, **kw):
    h, w = pixels.shape[:2]
    return DecodedImage(pixels, width or w, height or h, "PNG", "RGB", kw.get("animated", False), 1)


def _verdicts(pixels: np.ndarray, **kw) -> dict:
    return {f.name: f for f in run_cheap_filters(_image(pixels, **kw), T)}


def _scene() -> np.ndarray:
    scene = Scene((ShapeObject("circle", "red", 0), ShapeObject("square", "blue", 8)))
    return render(scene, 256, 256)


def test_a_plain_scene_passes_everything():
    verdicts = _verdicts(_scene(), width=512, height=512)
    assert list(verdicts) == list(CHEAP_FILTERS)
    assert all(v.passed for v in verdicts.values()), [v.reason for v in verdicts.values()]


def test_resolution_and_aspect_use_the_original_size():
    v = _verdicts(_scene(), width=200, height=200)
    assert not v["resolution"].passed and "shorter side" in v["resolution"].reason
    v = _verdicts(_scene(), width=4000, height=1000)
    assert v["resolution"].passed and not v["aspect_ratio"].passed
    assert v["aspect_ratio"].score == 4.0


def test_animated_images_are_rejected_when_configured():
    assert not _verdicts(_scene(), width=512, height=512, animated=True)["animation"].passed
    keep = StageThresholds(reject_animated=False)
    results = run_cheap_filters(_image(_scene(), 512, 512, animated=True), keep)
    assert all(r.passed for r in results if r.name == "animation")


def test_noise_is_told_from_detail_by_neighbour_correlation_at_any_size():
    """The noise filter reads how well pixels predict their neighbours, which reducing an
    image to the analysis size does not change for noise: at 256 px a noise image's
    Laplacian is extreme, but from 700 px on it falls below a grass photo's (the old rule missed
    it), while its neighbour correlation stays near 0."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (256, 256), dtype=np.uint8)
    assert laplacian_variance(small) > 5 * T.max_laplacian_var
    assert abs(neighbour_correlation(small)) < 0.05
    for side in (300, 700, 1500):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
        image = decode(buf.getvalue())  # reduced to the 256-px analysis size
        v = {f.name: f for f in run_cheap_filters(image, T)}
        assert v["laplacian"].passed == (side >= 700), (side, v["laplacian"].score)
        assert not v["noise"].passed and v["noise"].score < T.min_neighbour_corr, side
        assert "neighbour correlation" in v["noise"].reason
    smooth = np.tile(np.linspace(0, 255, 256, dtype=np.uint8), (256, 1))
    assert laplacian_variance(smooth) < 1.0 and neighbour_correlation(smooth) > 0.99
    assert neighbour_correlation(np.full((64, 64), 7, np.uint8)) == 1.0  # flat is not noise
    assert edge_density(small) > edge_density(smooth)


def test_neighbour_correlation_is_the_pearson_correlation_of_neighbours():
    rng = np.random.default_rng(1)
    grey = np.cumsum(rng.integers(0, 9, (40, 50)), axis=1).astype(np.uint8)
    g = grey.astype(np.float64)
    across = np.corrcoef(g[:, 1:].ravel(), g[:, :-1].ravel())[0, 1]
    down = np.corrcoef(g[1:].ravel(), g[:-1].ravel())[0, 1]
    assert neighbour_correlation(grey) == pytest.approx(0.5 * (across + down), rel=1e-12)
    assert planes(np.repeat(grey[:, :, None], 3, 2)).neighbour_corr == pytest.approx(
        neighbour_correlation(grey), rel=1e-12
    )


def test_laplacian_ignores_a_detailed_region_that_does_not_cover_the_frame():
    rng = np.random.default_rng(0)
    img = np.full((256, 256), 40, np.uint8)
    img[:80] = rng.integers(0, 256, (80, 256))  # texture on the top third only
    assert laplacian_variance(img) < T.max_laplacian_var


def test_flat_and_extreme_images():
    flat = np.full((128, 128, 3), (30, 120, 200), np.uint8)
    white = np.full((128, 128, 3), 255, np.uint8)
    black = np.zeros((128, 128, 3), np.uint8)
    assert rgb_entropy(flat) == 0.0 and flat_ratio(flat) == 1.0
    assert white_ratio(white) == 1.0 and black_ratio(white) == 0.0
    assert black_ratio(black) == 1.0
    v = _verdicts(flat, width=512, height=512)
    assert not v["flat_color"].passed and not v["entropy"].passed
    scene = _scene()
    assert 0.3 < flat_ratio(scene) < T.max_flat_ratio


@pytest.mark.parametrize("edges", ["top+bottom", "left+right", "all"])
def test_border_bands_are_measured(edges):
    img = _scene().copy()
    band = 20  # of 256 px
    if edges in ("top+bottom", "all"):
        img[:band], img[-band:] = 255, 255
    if edges in ("left+right", "all"):
        img[:, :band], img[:, -band:] = 255, 255
    assert border_fraction(img) == pytest.approx(band / 256, abs=1 / 256)
    assert not _verdicts(img, width=512, height=512)["border"].passed


def test_a_band_of_the_background_colour_is_not_a_border():
    # A solid background is uniform up to the edge, but never ends in a hard line.
    assert border_fraction(_scene()) == 0.0
    gradient = np.repeat(np.linspace(0, 120, 256)[:, None, None], 256, 1).repeat(3, 2)
    assert border_fraction(gradient.astype(np.uint8)) == 0.0


def test_natural_photos_pass_the_cheap_filters(real_photos):
    """Real photos pass, grass and gravel included (textures are photos: the thresholds are
    calibrated on them, benchmarks/curate_filters.py); the rejects are the ones a person
    would reject."""
    cfg = CurateConfig()
    expected_rejects = {
        "page.png": "resolution",  # 191 px tall
        "text.png": "resolution",
        "Minduka_Present_Blue_Pack.png": "resolution",  # 128 px icon
    }
    for name, data in real_photos.items():
        results = run_cheap_filters(decode(data), cfg.thresholds())
        failed = next((r.name for r in results if not r.passed), None)
        assert failed == expected_rejects.get(name), (name, [r.reason for r in results])


def test_unknown_stage_is_a_user_error():
    from krea2.infra.errors import UserError

    with pytest.raises(UserError, match="stage '2048'"):
        CurateConfig(stage="2048").thresholds()
