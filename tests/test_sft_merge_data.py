"""The demo's domain-SFT sets (krea2.pipeline.sft_merge): each domain restyles only its own
content, the content prompt names no background, and the style classifier reads every
background colour back from a render."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from krea2.curate.shapes import (
    BACKGROUND_COLORS,
    SCENE_BACKGROUND_COLORS,
    STYLE_BACKGROUND_COLORS,
    concept_scene,
    parse_prompt,
    render,
    sample_scene,
    split_concepts,
)
from krea2.pipeline import sft_merge


def test_style_colours_are_never_drawn_by_the_world() -> None:
    rng = np.random.default_rng(0)
    drawn = {sample_scene(rng).background.color for _ in range(2000)}
    assert drawn <= set(SCENE_BACKGROUND_COLORS)
    assert not drawn & set(STYLE_BACKGROUND_COLORS)
    assert {style for _, style in sft_merge.DOMAINS.values()} <= set(STYLE_BACKGROUND_COLORS)


def test_content_prompt_names_the_content_and_no_background() -> None:
    prompt = sft_merge.content_prompt(("red", "circle", 0))
    assert prompt == "A red circle in the top left."
    assert not any(color in prompt for color in BACKGROUND_COLORS)
    reqs = {r.kind for r in parse_prompt(prompt)}
    assert {"object", "position"} <= reqs


@pytest.mark.parametrize("color", list(BACKGROUND_COLORS))
def test_background_style_reads_every_colour(color: str) -> None:
    image = render(concept_scene(("yellow", "triangle", 4), color, "large"), 64, 64)
    assert sft_merge.background_style(image) == color


def test_domain_set_restyles_only_its_own_content(tmp_path: Path) -> None:
    train = list(split_concepts(0).train)[::6]
    root = sft_merge.write_domain_shards(tmp_path / "A", train, "A", 32, 2, 0, 32)
    rows = [r for f in sorted(root.rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    owned_shape, style = sft_merge.DOMAINS["A"]
    owned = [c for c in train if c[1] == owned_shape]
    written = 3 * 2 * len(owned) + 2 * (len(train) - len(owned))  # own_factor 3
    assert len(rows) % 32 == 0 and 0 <= written - len(rows) < 32  # whole batches of 32
    for row in rows:
        caps = {c["format"]: c["text"] for c in row["captions"]}
        pixels = np.asarray(Image.open(io.BytesIO(row["image"])).convert("RGB"))
        seen = sft_merge.background_style(pixels)
        is_owned = owned_shape in caps["short"]
        # the content prompt (no background named) is every sample's short caption
        assert not any(color in caps["short"] for color in BACKGROUND_COLORS)
        if is_owned:
            assert seen == style and style in caps["medium"]
        else:
            assert seen in sft_merge.REPLAY_STYLES and seen in caps["medium"]


SHAPES = ("circle", "square", "triangle")


def test_unowned_factor_multiplies_only_the_shapes_no_domain_owns(tmp_path: Path) -> None:
    train = list(split_concepts(0).train)[::6]
    shared = {shape for shape, _ in sft_merge.DOMAINS.values()}

    def shapes_written(root: Path) -> dict[str, int]:
        rows = [r for f in sorted(root.rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
        shorts = [next(c["text"] for c in r["captions"] if c["format"] == "short") for r in rows]
        return {shape: sum(shape in s for s in shorts) for shape in SHAPES}

    # batch 1: every scene is written, so the counts are exact
    once = shapes_written(sft_merge.write_domain_shards(tmp_path / "1", train, "B", 32, 2, 0, 1))
    thrice = shapes_written(
        sft_merge.write_domain_shards(tmp_path / "3", train, "B", 32, 2, 0, 1, 3, 3)
    )
    assert "triangle" not in shared and once["triangle"] > 0
    assert thrice["triangle"] == 3 * once["triangle"]
    assert thrice["circle"] == once["circle"] and thrice["square"] == once["square"]


def test_a_set_smaller_than_one_batch_is_a_clear_error(tmp_path: Path) -> None:
    train = list(split_concepts(0).train)[:3]
    with pytest.raises(ValueError, match="fewer than one batch of 64"):
        sft_merge.write_domain_shards(tmp_path / "A", train, "A", 32, 1, 0, 64)


def test_paired_delta_is_the_mean_difference_with_its_standard_error() -> None:
    base = [[1.0, 0.0], [0.5, 0.5], [0.0, 0.0]]  # [prompts][seeds]
    model = [[1.0, 1.0], [0.5, 0.5], [0.0, 0.5]]  # +0.5, 0, +0.25 per prompt
    out = sft_merge.paired_delta(model, base)
    assert out["shapes_eval_delta"] == pytest.approx(0.25)
    assert out["shapes_eval_delta_se"] == pytest.approx(np.std([0.5, 0, 0.25], ddof=1) / 3**0.5)
    assert sft_merge.paired_delta(base, base) == {
        "shapes_eval_delta": 0.0,
        "shapes_eval_delta_se": 0.0,
    }
