"""The shape-fidelity reward: the verifier's template IoU as a dense score."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.shapes import concept_scene, render
from krea2.rl.rewards import ShapeFidelityReward, load_reward, shape_fidelity_score


def _image(color: str, shape: str, cell: int = 4) -> np.ndarray:
    return render(concept_scene((color, shape, cell), "black", "large"), 64, 64)


def test_the_asked_shape_scores_high_and_a_wrong_one_or_colour_low() -> None:
    prompt = "A yellow square in the center."
    right, margin = shape_fidelity_score(prompt, _image("yellow", "square"))
    assert right > 0.9 and margin > 0
    wrong, wrong_margin = shape_fidelity_score(prompt, _image("yellow", "circle"))
    assert wrong < right and wrong_margin < 0  # the verifier reads the circle as a circle
    assert shape_fidelity_score(prompt, _image("blue", "square")) == (0.0, -1.0)  # no yellow at all


def test_a_ragged_square_scores_between_a_clean_one_and_none() -> None:
    clean = _image("yellow", "square")
    ragged = clean.copy()
    ys, xs = np.nonzero(clean.sum(-1) > 0)
    ragged[ys.min() : ys.min() + 4, xs.min() : xs.min() + 4] = 0  # bite off two corners
    ragged[ys.max() - 3 : ys.max() + 1, xs.max() - 3 : xs.max() + 1] = 0
    out = ShapeFidelityReward()(np.stack([clean, ragged]), ["A yellow square."] * 2)
    assert 0 < out.scores[1] < out.scores[0] and out.scores[0] > 0.5  # 0.5: the decision
    assert out.sub_scores["iou"][1] < out.sub_scores["iou"][0]
    np.testing.assert_allclose(out.scores, (1 + out.sub_scores["margin"]) / 2)


def test_by_name_and_bad_input() -> None:
    assert isinstance(load_reward("shape-fidelity"), ShapeFidelityReward)
    assert shape_fidelity_score("a picture", _image("red", "circle")) == (1.0, 1.0)  # nothing asked
    with pytest.raises(ValueError, match="prompts"):
        ShapeFidelityReward()(np.stack([_image("red", "circle")]), ["a", "b"])
