"""Synthetic user prompts know what they kept and dropped; faithfulness is checked by grammar."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from krea2.curate import shapes
from krea2.expander.faithfulness import check_faithfulness
from krea2.expander.user_prompts import UserPromptConfig, scene_weight, user_prompt


def _scenes(n: int, seed: int = 0) -> list[shapes.Scene]:
    rng = np.random.default_rng(seed)
    return [shapes.sample_scene(rng, max_objects=4, word_prob=0.4) for _ in range(n)]


@pytest.mark.parametrize("target", ["long", "medium"])
def test_a_request_states_exactly_what_it_kept_and_its_target_is_faithful_to_it(target):
    rng = np.random.default_rng(1)
    config = UserPromptConfig(target=target)
    for scene in _scenes(400):
        p = user_prompt(scene, rng, config)
        everything = set(shapes.scene_requirements(scene))
        assert p.kept, p.text
        assert tuple(shapes.parse_prompt(p.text)) == p.kept
        assert set(p.kept) <= everything, p.text
        assert not set(p.kept) & set(p.dropped)
        assert set(p.kept) | set(p.dropped) >= {r for r in everything if r.kind != "count"}
        caption = shapes.captions(scene)[target]
        # The caption itself, or (where it only implies a count the request states) the
        # caption after that count in the request's words.
        assert p.target == caption or p.target.endswith(". " + caption), (p.target, caption)
        assert check_faithfulness(p.text, p.target).faithful, (p.text, p.target)


def test_requests_drop_details_at_the_configured_rates():
    rng = np.random.default_rng(2)
    prompts = [user_prompt(s, rng) for s in _scenes(400, seed=3)]
    dropped_positions = sum(any(r.kind == "position" for r in p.dropped) for p in prompts)
    assert dropped_positions > 0.6 * len(prompts)  # keep_position 0.3: most leave places open
    assert {p.style for p in prompts} == {"terse", "conversational", "instruction"}
    assert len({p.text for p in prompts}) > 0.9 * len(prompts)


def test_keeping_everything_drops_nothing_and_keeping_nothing_still_names_one_shape():
    everything = UserPromptConfig(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    bare = UserPromptConfig(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    rng = np.random.default_rng(4)
    for scene in _scenes(200, seed=5):
        full = user_prompt(scene, rng, everything)
        # A kind shown several times is asked for by number ("two red triangles"): the
        # request grammar places single shapes only, so those positions are always open.
        kinds = Counter((o.color, o.shape) for o in scene.objects)
        several = {kind for kind, n in kinds.items() if n > 1}
        assert all(r.kind == "position" and (r.color, r.shape) in several
                   for r in full.dropped), (full.text, full.dropped)  # fmt: skip
        least = user_prompt(scene, rng, bare)
        assert {r.kind for r in least.kept} <= {"object", "count"}
        assert len({(r.color, r.shape) for r in least.kept}) == 1


def test_the_thinking_trace_names_the_request_and_what_is_left_open():
    scene = shapes.Scene(
        (shapes.ShapeObject("circle", "red", 0), shapes.ShapeObject("square", "blue", 8)),
        shapes.Background("gradient", "navy", "black"),
    )
    cfg = UserPromptConfig(mention_kind=1.0, keep_position=0.0, keep_total=0.0)
    p = user_prompt(scene, np.random.default_rng(0), cfg)
    assert "a red circle" in p.thinking and "a blue square" in p.thinking
    assert "Open: where the shapes go" in p.thinking and "the background" in p.thinking


def test_rich_scenes_weigh_more():
    plain = shapes.Scene((shapes.ShapeObject("circle", "red", 4),))
    rich = shapes.Scene((shapes.ShapeObject("circle", "red", 4),), word=shapes.Word("SUN", 0))
    assert scene_weight(plain) == 1.0 and scene_weight(rich, rich=3.0) == 3.0


TOP_LEFT, SUN = "a red circle in the top left", 'the word "SUN"'


@pytest.mark.parametrize(
    ("request_text", "expansion", "missing", "contradicted"),
    [
        ("a red circle", "A blue square in the center.", ("a red circle",), ()),
        ("a red circle in the top left", "A red circle on the right.", (), (TOP_LEFT,)),
        ("two red circles", "Three red circles.", (), ("exactly 2 red circles",)),
        ("three shapes: a red circle", "Two shapes. A red circle.", (), ("exactly 3 shapes",)),
        ('a red circle with the word "SUN"', 'A red circle, the word "CAT".', (), (SUN,)),
        ('a red circle with the word "SUN"', "A red circle.", (SUN,), ()),
    ],
)  # fmt: skip
def test_faithfulness_finds_missing_and_contradicted_requirements(
    request_text, expansion, missing, contradicted
):
    f = check_faithfulness(request_text, expansion)
    assert (f.missing, f.contradicted) == (missing, contradicted)
    assert not f.faithful and 0.0 <= f.score < 1.0


def test_a_request_with_no_requirements_is_trivially_kept():
    assert check_faithfulness("something nice", "A red circle.").score == 1.0


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="probability"):
        UserPromptConfig(keep_position=1.5)
    with pytest.raises(ValueError, match="styles"):
        UserPromptConfig(styles={"shouting": 1.0})
