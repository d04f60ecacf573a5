"""GDPO rewards and the gated trl trainer: diversity per group, gates, user-request scoring."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from krea2.expander.gdpo import GatedGRPOTrainer, GdpoConfig, run_gdpo
from krea2.expander.rewards import (
    ExpanderRewards,
    Gate,
    completion_text,
    group_diversity,
    pixel_embedding,
    request_text,
)
from krea2.expander.toy_model import ToyModelConfig, tiny_qwen3, train_tokenizer
from krea2.rl.rewards import ShapesRubricReward


def chat(request: str) -> list[dict]:
    return [{"role": "system", "content": "s"}, {"role": "user", "content": request}]


def answer(text: str) -> list[dict]:
    return [{"role": "assistant", "content": f"<think>\nplan\n</think>\n\n{text}"}]


def test_rewards_score_the_users_request_and_diversity_within_each_group(perfect_renderer):
    rewards = ExpanderRewards(perfect_renderer, {"rubric": ShapesRubricReward()}, num_generations=2)
    prompts = [
        chat("a red circle"),
        chat("a red circle"),
        chat("a blue square"),
        chat("a blue square"),
    ]
    completions = [
        answer("A red circle in the top left."),  # keeps the request
        answer("A green triangle in the center."),  # drops it: faithfulness and rubric 0
        answer("A blue square on the left."),
        answer("A blue square on the left."),  # the same image twice: no diversity
    ]  # fmt: skip
    funcs = rewards.reward_funcs()
    assert [f.__name__ for f in funcs] == ["faithfulness", "rubric", "diversity"]
    got = {f.__name__: f(prompts=prompts, completions=completions) for f in funcs}
    assert got["faithfulness"] == [1.0, 0.0, 1.0, 1.0]
    assert got["rubric"][0] == 1.0 and got["rubric"][1] < 0.5
    assert got["diversity"][0] > 0.1 and got["diversity"][2:] == pytest.approx([0.0, 0.0], abs=1e-5)
    with pytest.raises(ValueError, match="consecutive groups of 2"):
        rewards.score(prompts[:3], completions[:3])


def test_group_diversity_and_pixel_embedding():
    same = np.ones((3, 4), np.float32)
    assert group_diversity(same, 3) == pytest.approx([0, 0, 0], abs=1e-6)
    orth = np.eye(4, dtype=np.float32)
    assert group_diversity(orth, 2) == pytest.approx([1, 1, 1, 1])
    images = np.random.default_rng(0).integers(0, 255, (2, 64, 48, 3), dtype=np.uint8)
    e = pixel_embedding(images)
    assert e.shape == (2, 768) and np.allclose(np.linalg.norm(e, axis=1), 1.0)


def test_the_gate_blocks_words_and_classifier_flags():
    gate = Gate(
        blocklist=("gore", "nsfw"), classifier=lambda texts: ["forbidden" in t for t in texts]
    )
    mask, reasons = gate(["a red circle", "NSFW circle", "x"], ["fine", "fine", "forbidden thing"])
    assert mask.tolist() == [False, True, True]
    assert reasons == ["", "blocklist: 'NSFW'", "classifier"]
    assert request_text(chat("hello")) == "hello" and completion_text(answer("x")) == "x"


class RecordingTrainer(GatedGRPOTrainer):
    seen: ClassVar[list] = []

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        last = self.expander_rewards.last
        RecordingTrainer.seen.append((out["advantages"].clone(), last["gated"].copy(), last))
        return out


def test_a_gated_request_never_gets_a_positive_advantage(tmp_path, monkeypatch, perfect_renderer):
    import krea2.expander.gdpo as gdpo

    requests = ["a red circle", "a blue square", "forbidden red circle", "a green triangle"]
    texts = [*requests, "A red circle in the top left.", "<think>", "</think>"]
    tok = train_tokenizer(texts, 300)
    model = tiny_qwen3(
        tok, ToyModelConfig(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    )
    rewards = ExpanderRewards(
        perfect_renderer, {"rubric": ShapesRubricReward()}, num_generations=4,
        gate=Gate(blocklist=("forbidden",)),
    )  # fmt: skip
    monkeypatch.setattr(gdpo, "GatedGRPOTrainer", RecordingTrainer)
    cfg = GdpoConfig(steps=2, prompts_per_step=4, num_generations=4, max_completion_length=12)
    run_gdpo(model, tok, requests, rewards, tmp_path / "gdpo", cfg)
    assert RecordingTrainer.seen
    for advantages, gated, last in RecordingTrainer.seen:
        assert gated.any(), last["requests"]  # every batch holds the forbidden request
        assert (advantages[gated] <= 0).all()
        assert all("forbidden" in r for r, g in zip(last["requests"], gated, strict=True) if g)
    assert (tmp_path / "gdpo" / "config.json").exists()


def test_bad_settings_are_refused(perfect_renderer):
    with pytest.raises(ValueError, match="num_generations >= 2"):
        ExpanderRewards(perfect_renderer, {}, num_generations=1)
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        GdpoConfig(num_generations=1)
    with pytest.raises(ValueError, match="vllm_mode 'remote'"):
        GdpoConfig(use_vllm=True, vllm_mode="remote")


def test_rewards_see_the_expansion_apart_from_the_trace_as_trl_decodes_it():
    # trl decodes completions with skip_special_tokens=True: the think markers must survive
    # it (as in Qwen3), or faithfulness would read the trace that restates the request and
    # the DiT would render the trace.
    tok = train_tokenizer(["a red circle", "<think>\nplan\n</think>\n\nA red circle."], 300)
    ids = tok(answer("A red circle in the top left.")[0]["content"] + tok.eos_token)["input_ids"]
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert completion_text([{"role": "assistant", "content": decoded}]) == (
        "A red circle in the top left."
    )
