"""trl SFT of the toy expander: tokenizer from the chats, tiny Qwen3, save, load, generate."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate import shapes
from krea2.expander.sft import SftConfig, generate, prompt_completion, run_sft
from krea2.expander.sft_data import Shaping, shapes_sft_examples, split_answer
from krea2.expander.toy_model import ToyModelConfig, load_model, train_tokenizer


def _examples(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    scenes = [shapes.sample_scene(rng) for _ in range(n)]
    return shapes_sft_examples(scenes, seed=0, shaping=Shaping(rich=1))


def test_the_tokenizer_round_trips_chats_and_keeps_the_markers_whole():
    examples = _examples(30)
    tok = train_tokenizer([m["content"] for e in examples for m in e["messages"]], 512)
    text = tok.apply_chat_template(examples[0]["messages"], tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    for marker in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert len(tok(marker, add_special_tokens=False)["input_ids"]) == 1
    # whole words of the world are single tokens: sequences stay short
    assert len(tok(" red circle", add_special_tokens=False)["input_ids"]) == 2


def test_sft_memorises_a_few_chats_and_the_saved_model_generates_them(tmp_path):
    examples = _examples(4)
    cfg = SftConfig(
        toy=ToyModelConfig(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128),
        vocab_size=400, steps=80, batch_size=4, lr=1e-2, log_every=10,
    )  # fmt: skip
    result = run_sft(examples, tmp_path / "sft", cfg)
    losses = [loss for _, loss in result["losses"]]
    assert losses[-1] < 0.2 * losses[0], losses
    model, tok = load_model(tmp_path / "sft")
    requests = [e["messages"][1]["content"] for e in examples]
    answers = generate(model.eval(), tok, requests, max_new_tokens=160)
    want = [split_answer(e["messages"][2]["content"]) for e in examples]
    assert [split_answer(a) for a in answers] == want


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="no SFT examples"):
        run_sft([], tmp_path)
    with pytest.raises(ValueError, match="end with the assistant"):
        prompt_completion({"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(FileNotFoundError, match="no model here"):
        load_model(tmp_path)
    assert split_answer("no think block") == ("", "no think block")


def test_gradient_checkpointing_changes_the_cost_not_the_losses(tmp_path):
    import torch

    from krea2.expander.sft import checkpointing

    assert checkpointing(None) is torch.cuda.is_available()  # CPU: off, it saves nothing
    assert checkpointing(True) and not checkpointing(False)
    examples = _examples(4)
    losses = []
    for on in (True, False):
        cfg = SftConfig(
            toy=ToyModelConfig(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128),
            vocab_size=400, steps=12, batch_size=4, lr=1e-2, log_every=4,
            gradient_checkpointing=on,
        )  # fmt: skip
        losses.append([loss for _, loss in run_sft(examples, tmp_path / str(on), cfg)["losses"]])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
