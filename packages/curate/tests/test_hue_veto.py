"""The saturated-hue histogram tells recoloured objects apart where phash and colorhash cannot."""

from __future__ import annotations

import numpy as np
from PIL import Image

from krea2.curate.dedup import near_duplicate_pairs
from krea2.curate.hashes import HUE_BINS, hue_distance, hue_histogram
from krea2.curate.image_analysis import analyze_bytes
from krea2.curate.shapes import render
from krea2.curate.shapes.defects import encode
from krea2.curate.shapes.spec import Background, Scene, ShapeObject


def one_object(color: str, shape: str = "circle", cell: int = 4) -> Scene:
    return Scene((ShapeObject(shape, color, cell, "large"),), Background("solid", "black"))


def hashes_of(images: list[np.ndarray]) -> dict[str, np.ndarray]:
    analyses = [analyze_bytes(encode(px, "png")) for px in images]
    return {
        k: np.stack([np.frombuffer(a.hashes[k], np.uint8) for a in analyses])
        for k in ("phash12", "colorhash", "phash8", "huehist")
    }


def test_histogram_layout_and_distance_bounds():
    px = render(one_object("blue"), 128, 128)
    h = np.frombuffer(hue_histogram(px), np.uint8)
    assert h.shape == (HUE_BINS + 1,)
    assert abs(int(h[:HUE_BINS].sum()) - 255) <= HUE_BINS  # rounding of each bin
    assert h[HUE_BINS] > 0  # some pixels are saturated
    grey = np.full((64, 64, 3), 128, np.uint8)
    g = np.frombuffer(hue_histogram(grey), np.uint8)
    assert g[HUE_BINS] == 0
    assert hue_distance(h[None], h[None])[0] == 0.0
    assert hue_distance(h[None], g[None])[0] == 0.0  # no hue information: never vetoes


def test_recoloured_objects_pass_phash_and_colorhash_but_not_the_hue_veto():
    colors = ["green", "blue", "yellow", "purple", "cyan", "pink"]
    hs = hashes_of([render(one_object(c), 320, 320) for c in colors])
    without = near_duplicate_pairs(hs["phash12"], hs["colorhash"], hs["phash8"])
    assert len(without) > 0  # the weakness this veto exists for
    with_hue = near_duplicate_pairs(hs["phash12"], hs["colorhash"], hs["phash8"], hue=hs["huehist"])
    assert len(with_hue) == 0


def test_near_duplicate_edits_survive_the_hue_veto():
    base = render(one_object("purple", "square", 2), 320, 320)
    resized = np.asarray(Image.fromarray(base).resize((250, 250)))
    shifted = np.roll(base, 4, axis=1)
    hs = hashes_of([base, resized, shifted])
    pairs = near_duplicate_pairs(hs["phash12"], hs["colorhash"], hs["phash8"], hue=hs["huehist"])
    assert {tuple(p) for p in pairs} >= {(0, 1), (0, 2)}
