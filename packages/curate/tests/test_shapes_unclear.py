"""The verifier's unclear verdict: a shape read by a hair meets no shape requirement."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image, ImageDraw

from krea2.curate import shapes
from krea2.curate.shapes.detect import UNCLEAR_MARGIN, detect_objects

RED = shapes.COLORS["red"]


def _drawn(kind: str, size: int = 64, radius: float = 0.0, ss: int = 8) -> np.ndarray:
    """A red shape in the centre cell on black; ``kind`` ``rounded``: a square whose
    corners are rounded by ``radius`` × its side."""
    s = size * ss
    img = Image.new("RGB", (s, s), (0, 0, 0))
    box = (0.35 * s, 0.35 * s, 0.65 * s, 0.65 * s)  # a large shape in the centre cell
    draw = ImageDraw.Draw(img)
    if kind == "circle":
        draw.ellipse(box, fill=RED)
    elif kind == "square":
        draw.rectangle(box, fill=RED)
    else:
        draw.rounded_rectangle(box, radius=radius * (box[2] - box[0]), fill=RED)
    return cv2.resize(np.asarray(img), (size, size), interpolation=cv2.INTER_AREA)


# Corner radius 0.3 of the side: the template IoUs of circle and square tie to within 0.03
# at 32-128 px, the shape "exactly between" them.
BETWEEN = 0.3


@pytest.mark.parametrize("size", [32, 64, 128])
def test_a_square_rounded_halfway_to_a_circle_is_unclear(size):
    (obj,) = detect_objects(_drawn("rounded", size, BETWEEN))
    assert obj.margin < 0.75 * UNCLEAR_MARGIN  # clear of the threshold: no kernel flips it
    assert obj.clear_shape() is None
    assert obj.clear_shape(0.0) in ("circle", "square")  # forced choice still picks one


def test_an_unclear_shape_fails_every_shape_requirement_but_not_the_total():
    image = _drawn("rounded", 64, BETWEEN)
    for shape in ("square", "circle"):
        v = shapes.verify(f"a red {shape} in the center and 1 shape", image)
        by = {r.requirement.kind: r.passed for r in v.results}
        assert by == {"object": False, "position": False, "total": True}, shape
        assert "1 red of unclear shape" in v.results[0].detail
        assert len(v.unclear) == 1
    count = shapes.verify("two red squares", np.concatenate([image, image], axis=1))
    assert count.by_kind()["count"] == 0.0
    # The old forced choice passes exactly one of the two by a hair.
    forced = [shapes.verify(f"a red {s}", image).score_forced for s in ("square", "circle")]
    assert sorted(forced) == [0.0, 1.0]


@pytest.mark.parametrize("size", [32, 64, 128])
@pytest.mark.parametrize("shape", ["square", "circle"])
def test_clean_squares_and_circles_still_pass(size, shape):
    image = _drawn(shape, size)
    (obj,) = detect_objects(image)
    assert obj.shape == shape and obj.margin > 1.5 * UNCLEAR_MARGIN
    v = shapes.verify(f"a red {shape} in the center", image)
    assert v.score == v.score_forced == 1.0 and not v.unclear
    other = "circle" if shape == "square" else "square"
    assert shapes.verify(f"a red {other}", image).score == 0.0


def test_colour_and_count_of_other_objects_are_unaffected():
    scene = shapes.Scene(
        (
            shapes.ShapeObject("triangle", "blue", 0),
            shapes.ShapeObject("triangle", "blue", 2),
        )
    )
    image = shapes.render(scene, 96, 96)
    image[32:64, 32:64] = _drawn("rounded", 32, BETWEEN)  # an unclear red blob in the centre
    v = shapes.verify("two blue triangles and a red square", image)
    by = {r.requirement.describe(): r.passed for r in v.results}
    assert by == {"a blue triangle": True, "exactly 2 blue triangles": True, "a red square": False}


def test_shapes_eval_reports_the_new_and_the_forced_score_side_by_side():
    scenes = [
        shapes.concept_scene(("red", "square", 4)),
        shapes.concept_scene(("red", "circle", 4)),
    ]
    blob = _drawn("rounded", 64, BETWEEN)
    images = np.stack([[blob, _drawn("square")], [blob, _drawn("circle")]])  # [2, 2, 64, 64, 3]
    result = shapes.shapes_eval(images, scenes)
    # Each row: the blob fails its object and position requirements under the new rule
    # (count fails too, total passes); the clean image passes everything.
    assert result.per_image == [[0.25, 1.0], [0.25, 1.0]]
    assert sorted(row[0] for row in result.per_image_forced) == [0.25, 1.0]  # one by a hair
    assert result.score == pytest.approx(0.625) and result.score_forced == pytest.approx(0.8125)
    assert result.all_correct == 0.5 and result.all_correct_forced == 0.75
    assert result.unclear_rate == 0.5 and result.unclear_margin == UNCLEAR_MARGIN
    assert result.by_kind["object"] == 0.5 and result.by_kind_forced["object"] == 0.75
    old = shapes.shapes_eval(images, scenes, unclear_margin=0.0)
    assert old.score == old.score_forced == result.score_forced and old.unclear_rate == 0.0


def test_verification_built_the_old_way_still_scores():
    v = shapes.verify("a red square", _drawn("square"))
    bare = shapes.Verification(v.results, v.objects)
    assert bare.score == bare.score_forced == 1.0 and bare.unclear == ()
    assert bare.by_kind() == bare.by_kind_forced() == {"object": 1.0}
