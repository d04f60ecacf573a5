"""The expander stage end to end at a tiny size, in front of a perfect ShapesWorld renderer:
SFT, GDPO with and without the diversity reward, the measures, and resuming."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from krea2.curate import shapes
from krea2.expander import ExpanderStageSettings, scene_requests
from krea2.expander.stage import expander_pipeline
from krea2.expander.toy_model import ToyModelConfig

TINY = ExpanderStageSettings(
    requests_per_scene=1,
    max_scenes=24,
    sft_steps=4,
    sft_batch=4,
    toy=ToyModelConfig(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64),
    gdpo_steps=1,
    gdpo_prompts=2,
    group=2,
    requests_per_concept=1,
    max_new_tokens=24,
    eval_seeds=[0, 1],
)


def scenes(seed: int, n: int) -> list[shapes.Scene]:
    rng = np.random.default_rng(seed)
    return [shapes.sample_scene(rng) for _ in range(n)]


def test_stage_measures_sft_and_both_gdpo_runs_then_resumes(tmp_path, perfect_renderer):
    def sample(prompts: list[str], seeds: list[int]) -> np.ndarray:
        return np.stack([perfect_renderer(prompts)] * len(seeds), axis=1)

    held_out = scenes(1, 3)
    result = expander_pipeline(
        tmp_path, scenes(0, 24), held_out, TINY, sample, lambda: perfect_renderer
    )
    assert result["sft_examples"] >= 24
    assert len(result["requests"]) == 3
    # The raw requests drawn perfectly meet their own requirements.
    assert result["raw"]["shapes_eval"] == pytest.approx(1.0)
    assert np.load(result["raw"]["images"]).shape == (3, 2, 64, 64, 3)
    assert set(result["models"]) == {"sft", "gdpo", "gdpo-no-diversity"}
    for m in result["models"].values():
        assert 0.0 <= m["faithful"] <= 1.0 and 0.0 <= m["shapes_eval"] <= 1.0
        assert 0.0 <= m["diversity"] <= 2.0 and 0.0 < m["distinct_expansions"] <= 1.0
        assert len(m["expansions"]) == 3
        assert np.load(m["group_images"]).shape == (3 * TINY.group, 64, 64, 3)
    # Both GDPO runs log the diversity reward (the ablation only weighs it 0).
    for run in ("gdpo", "gdpo-no-diversity"):
        assert result["curves"][run]["diversity"], result["curves"][run]
    json.dumps(result)  # the demo's stage record

    sft_weights = next((tmp_path / "sft").glob("*.safetensors"))
    before = sft_weights.stat().st_mtime_ns
    again = expander_pipeline(tmp_path, scenes(0, 24), held_out, TINY, sample, lambda: None)
    assert sft_weights.stat().st_mtime_ns == before  # nothing retrained
    assert again["models"]["gdpo"]["expansions"] == result["models"]["gdpo"]["expansions"]


def test_gdpo_weighs_every_image_reward_it_is_given(tmp_path, perfect_renderer):
    from krea2.rl.rewards import ShapesRubricReward, train_artifact_reward

    artifact = train_artifact_reward(n=40, seed=0, epochs=20)
    settings = replace(TINY, ablate_diversity=False, artifact_weight=0.5)
    result = expander_pipeline(
        tmp_path, scenes(0, 24), scenes(1, 2), settings,
        lambda p, s: np.stack([perfect_renderer(p)] * len(s), axis=1), lambda: perfect_renderer,
        lambda: {"rubric": ShapesRubricReward(ocr=False), "artifact": artifact},
    )  # fmt: skip
    assert set(result["models"]) == {"sft", "gdpo"}
    assert result["curves"]["gdpo"]["artifact"], result["curves"]["gdpo"]  # logged by trl


def test_scene_requests_are_one_fixed_draw():
    held_out = scenes(2, 4)
    a = scene_requests(held_out, 2, 7, "medium")
    b = scene_requests(held_out, 2, 7, "medium")
    assert [r.text for r in a] == [r.text for r in b] and len(a) == 8
    captions = [shapes.captions(s)["medium"] for s in held_out]
    assert all(r.target.endswith(c) for r, c in zip(a[::2], captions, strict=True))


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="target"):
        ExpanderStageSettings(target="poem")
    with pytest.raises(ValueError, match="group"):
        ExpanderStageSettings(group=1)
    with pytest.raises(ValueError, match="no training scenes"):
        expander_pipeline(tmp_path, [], scenes(1, 1), TINY, lambda p, s: None, lambda: None)
