"""ShapesWorld: scenes, rendering, captions, prompt parsing and the rubric verifier."""

from __future__ import annotations

import json

import numpy as np
import pytest

from krea2.curate import shapes
from krea2.curate.shapes import Scene, ShapeObject, Word
from krea2.infra.shards import CAPTION_FORMATS


def _scenes(n: int, seed: int = 0, **kw) -> list[Scene]:
    rng = np.random.default_rng(seed)
    return [shapes.sample_scene(rng, **kw) for _ in range(n)]


def test_sampling_is_deterministic_for_a_seed():
    assert _scenes(5, seed=3) == _scenes(5, seed=3)
    assert _scenes(5, seed=3) != _scenes(5, seed=4)


def test_render_any_size_and_aspect_ratio():
    scene = _scenes(1)[0]
    for w, h in [(32, 32), (64, 48), (48, 96), (320, 200)]:
        img = shapes.render(scene, w, h)
        assert img.shape == (h, w, 3) and img.dtype == np.uint8
    assert np.array_equal(shapes.render(scene, 64, 64), shapes.render(scene, 64, 64))


def test_invalid_specs_name_the_bad_value():
    with pytest.raises(ValueError, match="hexagon"):
        ShapeObject("hexagon", "red", 0)
    with pytest.raises(ValueError, match="distinct cells"):
        Scene((ShapeObject("circle", "red", 4), ShapeObject("square", "blue", 4)))
    with pytest.raises(ValueError, match="too small"):
        shapes.render(_scenes(1)[0], 4, 4)


def test_captions_in_the_five_shard_formats_and_json_round_trips():
    for scene in _scenes(20, word_prob=0.5):
        caps = shapes.captions(scene)
        assert tuple(caps) == CAPTION_FORMATS
        assert Scene.from_json(caps["json"]) == scene
        assert json.loads(caps["json"])["objects"]
        for o in scene.objects:
            assert f"{o.color} {o.shape}" in caps["long"]
            assert f"{o.size} {o.color} {o.shape}" in caps["long"]
        assert len(caps["long"]) > len(caps["medium"]) > len(caps["short"])


def test_parsed_captions_state_only_true_requirements():
    for scene in _scenes(40, word_prob=0.5, max_objects=4):
        truth = set(shapes.scene_requirements(scene))
        caps = shapes.captions(scene)
        for fmt in CAPTION_FORMATS:
            parsed = set(shapes.parse_prompt(caps[fmt]))
            assert parsed <= truth, (fmt, parsed - truth)
        positions = {r for r in truth if r.kind == "position"}
        assert positions <= set(shapes.parse_prompt(caps["long"]))
        assert positions <= set(shapes.parse_prompt(caps["medium"]))
        assert set(shapes.parse_prompt(caps["json"])) == truth


def test_free_prompt_is_split_into_requirements():
    reqs = shapes.parse_prompt('Two red circles, a blue square in the top left and the word "SUN"')
    described = {r.describe() for r in reqs}
    assert described == {
        "a red circle",
        "exactly 2 red circles",
        "a blue square",
        "a blue square in the top left",
        'the word "SUN"',
    }


@pytest.mark.parametrize(
    ("size", "kw"),
    [((64, 64), {}), ((256, 192), {}), ((96, 160), {}), ((32, 32), {"sizes": ("large",)})],
)
def test_verifier_scores_ground_truth_images_high(size, kw):
    scenes = _scenes(150, seed=11, **kw)
    scores = [shapes.verify(s, shapes.render(s, *size)).score for s in scenes]
    assert np.mean(scores) >= 0.98


def test_verifier_scores_mismatched_specs_low():
    scenes = _scenes(150, seed=12)
    images = [shapes.render(s, 96, 96) for s in scenes]
    mismatched = [shapes.verify(scenes[i - 1], images[i]).score for i in range(len(scenes))]
    assert np.mean(mismatched) <= 0.3


def test_verifier_catches_each_kind_of_error():
    scene = Scene((ShapeObject("circle", "red", 0), ShapeObject("square", "blue", 8)))
    image = shapes.render(scene, 96, 96)
    wrong_color = Scene((ShapeObject("circle", "green", 0), ShapeObject("square", "blue", 8)))
    wrong_place = Scene((ShapeObject("circle", "red", 2), ShapeObject("square", "blue", 8)))
    extra = Scene((*scene.objects, ShapeObject("triangle", "yellow", 4)))
    assert shapes.verify(scene, image).score == 1.0
    v = shapes.verify(wrong_color, image)
    assert v.by_kind()["object"] == 0.5 and v.score < 1
    v = shapes.verify(wrong_place, image)
    assert v.by_kind() == {"object": 1.0, "position": 0.5, "count": 1.0, "total": 1.0}
    v = shapes.verify(extra, image)
    assert v.by_kind()["total"] == 0.0


def test_verifier_reads_words_with_ocr(ocr_engine):
    scene = Scene((ShapeObject("square", "red", 0),), word=Word("KREA", 4))
    image = shapes.render(scene, 256, 256)
    assert shapes.verify(scene, image, ocr=ocr_engine).score == 1.0
    other = Scene(scene.objects, word=Word("MOON", 4))
    assert shapes.verify(other, image, ocr=ocr_engine).by_kind()["word"] == 0.0
    # Without an engine a word is never silently passed.
    assert shapes.verify(scene, image).by_kind()["word"] == 0.0


def test_shapes_eval_scores_rendered_scenes_and_prompts_per_kind():
    rng = np.random.default_rng(3)
    scenes = [shapes.sample_scene(rng, max_objects=2, word_prob=0.0) for _ in range(4)]
    images = np.stack([[shapes.render(s, 64, 64)] * 2 for s in scenes])  # [4, 2, 64, 64, 3]
    result = shapes.shapes_eval(images, scenes)
    assert result.score == 1.0 and result.all_correct == 1.0
    assert set(result.by_kind) == {"object", "position", "count", "total"}
    assert result.per_image == [[1.0, 1.0]] * 4
    prompts = [shapes.captions(s)["medium"] for s in scenes]
    wrong = shapes.shapes_eval(images[::-1], prompts)  # each image under another's prompt
    assert wrong.score < 0.5 and set(wrong.by_kind) <= {"object", "position", "count", "total"}


def test_the_toy_world_holds_out_concepts_but_every_colour_shape_and_cell_is_seen():
    split = shapes.split_concepts(0, 0.15)
    assert not set(split.train) & set(split.held_out) and split.held_out
    assert {c for c, _, _ in split.train} == set(shapes.WORLD_COLORS)
    assert {s for _, s, _ in split.train} == set(shapes.WORLD_SHAPES)
    assert {p for _, _, p in split.train} == set(range(9))
    prompt = shapes.eval_prompt(split.held_out[0])
    scene = shapes.concept_scene(split.held_out[0])
    assert shapes.verify(prompt, shapes.render(scene, 64, 64)).score == 1.0
