"""The reward contract: input conventions, empty batches, composition, group normalization."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from krea2.curate import shapes
from krea2.rl.rewards import (
    Reward,
    RewardOutput,
    ShapesRubricReward,
    WeightedSum,
    as_uint8_images,
    check_batch,
    group_normalize,
)


class _Brightness:
    """A tiny reward for composition tests: mean pixel value in [0, 1]."""

    name = "brightness"

    def __call__(self, images, prompts):
        pixels, _ = check_batch(images, prompts)
        mean = pixels.reshape(len(pixels), -1).mean(axis=1) / 255.0
        return RewardOutput(mean, {"half": mean / 2})


def _scene_batch(n: int, seed: int = 0, size: int = 64):
    rng = np.random.default_rng(seed)
    scenes = [shapes.sample_scene(rng) for _ in range(n)]
    images = np.stack([shapes.render(s, size, size) for s in scenes])
    prompts = [shapes.captions(s)["medium"] for s in scenes]
    return scenes, images, prompts


def test_float_images_in_minus_one_one_convert_to_the_same_uint8():
    pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 6, 3), dtype=np.uint8)
    floats = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    np.testing.assert_array_equal(as_uint8_images(floats), pixels)
    np.testing.assert_array_equal(as_uint8_images(floats.numpy()), pixels)
    np.testing.assert_array_equal(as_uint8_images(torch.from_numpy(pixels)), pixels)


@pytest.mark.parametrize(
    ("images", "match"),
    [
        (np.zeros((8, 8, 3), np.uint8), "batch"),
        (np.zeros((1, 8, 8, 4), np.uint8), r"\[B, H, W, 3\]"),
        (np.zeros((1, 8, 8, 3), np.float32), r"\[B, 3, H, W\]"),
        (np.zeros((1, 8, 8, 3), np.int64), "dtype"),
    ],
)
def test_badly_shaped_images_raise_a_value_error_naming_the_convention(images, match):
    with pytest.raises(ValueError, match=match):
        as_uint8_images(images)


def test_prompt_count_and_empty_prompts_are_rejected():
    images = np.zeros((2, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        check_batch(images, ["a red circle"])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        check_batch(images, ["a red circle", "  "])
    with pytest.raises(ValueError, match="not one string"):
        check_batch(images[:1], "a red circle")


def test_an_empty_batch_returns_empty_arrays():
    out = ShapesRubricReward()(np.zeros((0, 16, 16, 3), np.uint8), [])
    assert out.scores.shape == (0,) and out.scores.dtype == np.float32
    assert all(v.shape == (0,) for v in out.sub_scores.values())


def test_shapes_rubric_scores_the_rendered_scene_one_and_a_wrong_prompt_lower():
    scenes, images, prompts = _scene_batch(4)
    reward = ShapesRubricReward(ocr=False)
    assert isinstance(reward, Reward)
    # Scenes without words: every requirement is met by the render of its own scene.
    no_word = [i for i, s in enumerate(scenes) if s.word is None]
    assert no_word
    good = reward(images[no_word], [prompts[i] for i in no_word])
    np.testing.assert_allclose(good.scores, 1.0)
    assert np.isnan(good.sub_scores["word"]).all()
    np.testing.assert_allclose(good.sub_scores["object"], 1.0)
    wrong = reward(images[:1], ["a green square and a pink circle and a cyan triangle"])
    assert wrong.scores[0] < 1.0 and wrong.sub_scores["object"][0] < 1.0


def test_weighted_sum_adds_weighted_scores_and_prefixes_sub_scores():
    _, images, prompts = _scene_batch(3)
    rubric = ShapesRubricReward(ocr=False)
    combo = WeightedSum({"rubric": (rubric, 2.0), "bright": (_Brightness(), -1.0)})
    out = combo(images, prompts)
    r, b = rubric(images, prompts), _Brightness()(images, prompts)
    np.testing.assert_allclose(out.scores, 2.0 * r.scores - b.scores, rtol=1e-6)
    np.testing.assert_array_equal(out.sub_scores["bright"], b.scores)
    np.testing.assert_array_equal(out.sub_scores["bright/half"], b.sub_scores["half"])
    assert "rubric/object" in out.sub_scores


def test_group_normalize_is_a_per_group_z_score_and_zero_for_flat_groups():
    scores = np.array([1.0, 3.0, 5.0, 5.0, 2.0], np.float32)
    groups = np.array([0, 0, 1, 1, 2])
    out = group_normalize(scores, groups)
    np.testing.assert_allclose(out, [-1.0, 1.0, 0.0, 0.0, 0.0], atol=1e-6)
    assert out.dtype == np.float32


def test_concat_fills_missing_sub_scores_with_nan():
    a = RewardOutput(np.ones(2), {"x": np.zeros(2)})
    b = RewardOutput(np.zeros(1), {"y": np.ones(1)})
    c = RewardOutput.concat([a, b])
    np.testing.assert_array_equal(c.scores, [1, 1, 0])
    assert np.isnan(c.sub_scores["x"][2]) and np.isnan(c.sub_scores["y"][:2]).all()
