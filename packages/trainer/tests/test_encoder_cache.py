"""Frozen-encoder caches keyed by encoder fingerprint: a LoRA run over a small set encodes
each sample and caption once (the second epoch calls no encoder) with the uncached run's
losses, a later run on the same cache directory encodes nothing, and another encoder
never reads the first one's entries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_test_helpers import lora_job_toml

from krea2.dit.testing import write_tiny_model_folder
from krea2.dit.text import TextEncoder
from krea2.dit.vae import QwenImageVAE
from krea2.trainer.cache import EncoderCache, module_fingerprint
from krea2.trainer.cli import run_job
from krea2.trainer.observe import read_metrics
from krea2.trainer.testing import write_toy_shards

ROWS, BATCH, STEPS = 8, 4, 4  # two epochs of two batches


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cache")
    release = write_tiny_model_folder(root / "model")
    write_toy_shards(root / "train", ROWS, files=1, batch_size=BATCH, seed=0)
    return release, {"train": root / "train"}


def _run(setup, tmp_path: Path, name: str, monkeypatch, overrides=()) -> tuple[list, dict]:
    """Train the tiny LoRA job; returns its losses and the rows each encoder encoded."""
    release, shards = setup
    counts = {"text": 0, "latents": 0}
    text_encode, vae_encode = TextEncoder.encode, QwenImageVAE.encode

    def count_text(self, prompts):
        counts["text"] += 1 if isinstance(prompts, str) else len(prompts)
        return text_encode(self, prompts)

    def count_vae(self, pixels, sample=False):
        counts["latents"] += pixels.shape[0]
        return vae_encode(self, pixels, sample)

    monkeypatch.setattr(TextEncoder, "encode", count_text)
    monkeypatch.setattr(QwenImageVAE, "encode", count_vae)
    config = tmp_path / f"{name}.toml"
    # one caption per sample, so an epoch has as many distinct captions as samples
    stage = "caption_weights = { short = 1.0 }\ncaption_dropout = 0.0"
    config.write_text(lora_job_toml(tmp_path / name, release, shards, STEPS, stage_extra=stage))
    run_job(config, list(overrides), resume=False)
    monkeypatch.undo()
    rows = read_metrics(tmp_path / name / "metrics.jsonl")
    return [r["loss"] for r in rows if r["kind"] == "train"], counts


def test_the_second_epoch_encodes_nothing_and_the_losses_are_the_uncached_ones(
    setup, tmp_path, monkeypatch
):
    plain, plain_counts = _run(setup, tmp_path, "plain", monkeypatch)
    assert plain_counts["latents"] == STEPS * BATCH  # every step encodes its batch

    cache = tmp_path / "cache"
    cached, counts = _run(setup, tmp_path, "cached", monkeypatch, [f"data.cache_dir={cache}"])
    assert len(cached) == STEPS and cached == plain  # bit for bit
    assert counts["latents"] == ROWS  # the first epoch only
    assert 0 < counts["text"] <= ROWS < plain_counts["text"]
    # one directory per encoder fingerprint: the text encoder's and the autoencoder's
    assert len([d for d in cache.iterdir() if d.is_dir()]) == 2

    again, again_counts = _run(setup, tmp_path, "again", monkeypatch, [f"data.cache_dir={cache}"])
    assert again == plain and again_counts == {"text": 0, "latents": 0}


def test_a_cache_in_memory_alone_also_encodes_each_sample_once(setup, tmp_path, monkeypatch):
    overrides = ["data.cache_latents=64", "text.cache_size=64"]
    _, counts = _run(setup, tmp_path, "memory", monkeypatch, overrides)
    assert counts["latents"] == ROWS and counts["text"] <= ROWS


def test_another_encoder_gets_its_own_entries(tmp_path):
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    fa, fb = module_fingerprint(a), module_fingerprint(b)
    assert fa == module_fingerprint(a) and fa != fb
    with torch.no_grad():
        a.weight[0, 0] += 1e-3
    assert module_fingerprint(a) != fa  # a changed weight is another encoder
    one = EncoderCache(fb, 0, tmp_path)
    one.put("x", (torch.ones(2),))
    other = EncoderCache(fa, 0, tmp_path)
    calls = []
    rows = other.lookup(["x", "x"], lambda idx: calls.append(idx) or [(torch.zeros(2),)])
    assert calls == [[0]] and torch.equal(rows[1][0], torch.zeros(2))  # not b's entry
    assert torch.equal(EncoderCache(fb, 0, tmp_path).get("x")[0], torch.ones(2))


def test_memory_keeps_the_most_recent_entries():
    cache = EncoderCache("fp", capacity=2)
    for k in "abc":
        cache.put(k, (torch.tensor([ord(k)]),))
    assert cache.get("a") is None and cache.get("c") is not None
    assert not EncoderCache("fp").enabled
