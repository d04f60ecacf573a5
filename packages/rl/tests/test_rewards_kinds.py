"""Reward kinds: text rendering (OCR), artifact head, aesthetic (Bradley-Terry) head."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate import shapes
from krea2.rl.rewards import (
    AestheticReward,
    ArtifactReward,
    TextRenderingReward,
    calibrate_artifact_reward,
    evaluate_artifact_reward,
    grid_defect,
    preference_accuracy,
    render_defects,
    train_aesthetic_reward,
    train_artifact_reward,
)
from krea2.rl.rewards.text import edit_distance, quoted_texts, text_similarity


def test_quoted_texts_reads_double_curly_and_single_quotes_but_not_apostrophes():
    assert quoted_texts('a sign saying "open  now" and “Sun”') == ["OPEN NOW", "SUN"]
    assert quoted_texts("the word 'CAT' on a cat's mat") == ["CAT"]
    assert quoted_texts("a red circle") == []


def test_edit_distance_and_similarity():
    assert edit_distance("KREA", "KREA") == 0
    assert edit_distance("KREA", "KRFA") == 1
    assert edit_distance("", "ABC") == 3
    assert text_similarity("KREA", ["KRFA"]) == pytest.approx(0.75)
    assert text_similarity("KREA", ["HELLO KREA"]) == 1.0  # a word of a line matches
    assert text_similarity("KREA", []) == 0.0


@pytest.fixture(scope="module")
def word_image() -> np.ndarray:
    scene = shapes.Scene((shapes.ShapeObject("circle", "red", 0),), word=shapes.Word("HELLO", 4))
    return shapes.render(scene, 160, 160)[None]


def test_text_reward_scores_the_rendered_word_above_a_different_word(word_image):
    reward = TextRenderingReward()
    out = reward(np.concatenate([word_image, word_image]), ['the word "HELLO"', 'the word "MOON"'])
    assert out.scores[0] == pytest.approx(1.0)
    assert out.sub_scores["text_exact"][0] == 1.0
    assert out.scores[1] < 0.5 and out.sub_scores["text_exact"][1] == 0.0


def test_text_reward_is_neutral_with_nan_sub_scores_when_no_text_is_asked_for(word_image):
    out = TextRenderingReward(neutral=0.5)(word_image, ["a red circle"])
    assert out.scores[0] == 0.5
    assert np.isnan(out.sub_scores["text_similarity"][0])


@pytest.fixture(scope="module")
def artifact_reward(tmp_path_factory) -> ArtifactReward:
    path = tmp_path_factory.mktemp("heads") / "artifact.npz"
    train_artifact_reward(n=320, seed=0, path=path, epochs=300)
    return ArtifactReward.load(path)


def test_artifact_head_detects_held_out_defects_and_ranks_clean_above_defective(artifact_reward):
    report = evaluate_artifact_reward(artifact_reward, n=160, seed=7)
    assert report.auc > 0.9, report
    assert report.accuracy > 0.85, report
    assert report.clean_score > report.defect_score + 0.5, report
    assert set(report.recall_by_kind) == {"noise", "blur", "broken_shape", "border"}


def test_artifact_reward_scores_clean_renders_above_defective_ones(
    artifact_reward,
):
    images, labels, _ = render_defects(40, seed=11, sizes=(64,))
    out = artifact_reward(np.stack(images), ["x"] * len(images))
    assert np.all((out.scores >= 0) & (out.scores <= 1))
    np.testing.assert_allclose(out.scores, 1 - out.sub_scores["p_defect"], atol=1e-6)
    clean, defect = out.scores[labels == 0], out.scores[labels == 1]
    assert np.median(clean) > np.median(defect)


def test_a_saved_head_loads_to_the_same_scores(artifact_reward, tmp_path):
    images, _, _ = render_defects(6, seed=3, sizes=(64,))
    batch = np.stack(images)
    again = ArtifactReward.load(artifact_reward.save(tmp_path / "a.npz"))
    np.testing.assert_array_equal(
        artifact_reward(batch, ["x"] * 6).scores, again(batch, ["x"] * 6).scores
    )
    with pytest.raises(ValueError, match="cannot read a reward head"):
        ArtifactReward.load(tmp_path / "missing.npz")


def _generator_like(n: int, seed: int) -> np.ndarray:
    """Stand-ins for a small generator's clean samples: 64 px renders, softened and with a
    little noise (what the render-trained head mistakes for blur)."""
    import cv2

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        img = shapes.render(shapes.sample_scene(rng), 64, 64)
        soft = cv2.GaussianBlur(img, (0, 0), 1.0).astype(np.float64)
        out.append(np.clip(soft + rng.normal(0, 2, img.shape), 0, 255).astype(np.uint8))
    return np.stack(out)


def test_calibrating_on_a_generators_samples_makes_them_clean_and_the_grid_a_defect(
    artifact_reward,
):
    held_out = _generator_like(24, seed=21)
    grid = np.stack([grid_defect(img, np.random.default_rng(i)) for i, img in enumerate(held_out)])
    before = artifact_reward(held_out, ["x"] * 24).scores
    calibrated = calibrate_artifact_reward(_generator_like(48, seed=20), n=160, epochs=300)
    clean, gridded = calibrated(held_out, ["x"] * 24).scores, calibrated(grid, ["x"] * 24).scores
    assert np.median(clean) > 0.5 > np.median(gridded), (clean, gridded)
    assert np.median(clean) > np.median(before)
    # still a defect detector on renders
    assert evaluate_artifact_reward(calibrated, n=160, seed=7).auc > 0.9
    with pytest.raises(ValueError, match="at least one sample"):
        calibrate_artifact_reward(np.zeros((0, 64, 64, 3), np.uint8))


def _pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Winners: clean renders; losers: the same renders blurred or noised (a synthetic
    preference whose ground truth comes from the generator)."""
    images, _, _ = render_defects(2 * n, seed=seed, sizes=(64,))
    rng = np.random.default_rng(seed)
    clean = np.stack(images[0::2])
    noisy = np.clip(clean + rng.normal(0, 20, clean.shape), 0, 255).astype(np.uint8)
    return clean, noisy


def test_aesthetic_head_learns_held_out_preferences_and_round_trips(tmp_path):
    winners, losers = _pairs(60, seed=0)
    reward = train_aesthetic_reward(winners, losers, path=tmp_path / "aes.npz", epochs=200)
    w_test, l_test = _pairs(40, seed=5)
    assert preference_accuracy(reward, w_test, l_test) > 0.9
    again = AestheticReward.load(tmp_path / "aes.npz")
    out = again(w_test[:4], ["p"] * 4)
    np.testing.assert_array_equal(out.scores, reward(w_test[:4], ["p"] * 4).scores)
    assert np.all((out.sub_scores["p_over_median"] >= 0) & (out.sub_scores["p_over_median"] <= 1))
