"""The shape-fidelity reward: the verifier's template IoU as a dense score."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.shapes import COLORS, concept_scene, render
from krea2.rl.rewards import (
    ShapeFidelityReward,
    load_reward,
    shape_fidelity_score,
    shape_fidelity_terms,
)


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


def test_whole_asks_for_one_piece_and_counts_what_the_prompt_asks_for() -> None:
    one = _image("yellow", "triangle")
    split = one.copy()
    ys, xs = np.nonzero(one.sum(-1) > 0)
    mid = (ys.min() + ys.max()) // 2
    split[mid - 1 : mid + 2] = 0  # a dark band across: the triangle in two pieces
    prompt = ["A yellow triangle in the center."] * 2
    iou_one, margin_one, whole_one = shape_fidelity_terms(prompt[0], one)
    assert whole_one == 1.0 and (iou_one, margin_one) == shape_fidelity_score(prompt[0], one)
    _, _, whole_split = shape_fidelity_terms(prompt[0], split)
    assert 0.2 < whole_split < 0.9  # the largest piece's share of the yellow pixels
    blob = one.copy()
    x = int(xs.mean())
    blob[mid : mid + 6, x - 3 : x + 3] = COLORS["orange"]
    assert shape_fidelity_terms(prompt[0], blob)[2] < 1  # an orange blob inside: not asked for
    plain = ShapeFidelityReward()(np.stack([one, split]), prompt)
    whole = ShapeFidelityReward(whole=True)(np.stack([one, split]), prompt)
    np.testing.assert_allclose(whole.scores, plain.scores * whole.sub_scores["whole"])
    assert whole.scores[1] < plain.scores[1] and whole.scores[0] == plain.scores[0]
    assert isinstance(load_reward("shape-fidelity:whole"), ShapeFidelityReward)
    assert load_reward("shape-fidelity:whole").whole and not load_reward("shape-fidelity").whole
    with pytest.raises(ValueError, match="unknown reward"):
        load_reward("shape-fidelity:halves")
    # Two objects of one colour asked for: two pieces are both counted whole.
    two = np.maximum(_image("red", "circle", 0), _image("red", "square", 8))
    assert shape_fidelity_terms("A red circle in the top left and a red square in the "
                                "bottom right.", two)[2] == 1.0  # fmt: skip
    assert shape_fidelity_terms("a picture", one) == (1.0, 1.0, 1.0)  # nothing asked
