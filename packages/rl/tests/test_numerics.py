"""Exact where the math is exact, reproducible where it is measured (issue #36).

These checks must hold under every CPU kernel choice and thread count, not only on the
machine a test was written on: they carry the ``numerics`` marker, and
``scripts/numerics_matrix.py`` runs them again with other ATen, oneDNN and MKL instruction
sets and with 1 and 2 threads (docs/testing.md)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from krea2.rl.preference import PreferenceConfig, train_preference
from krea2.rl.preference.measures import high_frequency_energy, high_frequency_shares
from krea2.trainer import read_metrics

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import pair_job, write_pairs

pytestmark = pytest.mark.numerics

LORA = """
[stages.lora]
rank = 4
alpha = 8
"""


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_pairs(tmp_path_factory.mktemp("pairs"), n=8)


def first_row(job: Path, kind: str) -> dict:
    run = train_preference(job, PreferenceConfig(kind=kind, beta=5000.0))
    return next(r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train")


def assert_at_the_reference(row: dict) -> None:
    # β = 5000 turns any difference between the policy's and the reference's arithmetic
    # into a visible logit: at step 0 they are one model, so their errors must be equal to
    # the bit (same batch, same kernels; a frozen copy must not take another matmul path).
    assert row["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert row["winner_gap"] == 0.0 and row["loser_gap"] == 0.0 and row["margin"] == 0.0


@pytest.fixture(scope="module")
def base(tmp_path_factory, shards) -> Path:
    """A model a few DPO steps away from its seeded init (whose zero-initialised output
    layers would hide the text path): the start of the checks below."""
    root = tmp_path_factory.mktemp("base")
    job = pair_job(root, shards, steps=3, every=0)
    job.write_text(job.read_text().replace("lr = 1e-3", "lr = 1e-2"))
    return train_preference(job, PreferenceConfig(kind="dpo", beta=50.0)) / "checkpoints"


@pytest.mark.parametrize("kind", ["dpo", "stpo"])
@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
def test_the_first_preference_loss_is_log_two_at_the_reference(
    base, shards, tmp_path, kind, adapter
):
    # a LoRA policy's adapters start with B = 0: policy = base + 0, beside the frozen base
    job = pair_job(tmp_path, shards, steps=1, every=0)
    text = job.read_text().replace('init_from = "none"', f'init_from = "{base / "preference"}"')
    job.write_text(text + (LORA if adapter else ""))
    assert_at_the_reference(first_row(job, kind))


def test_high_frequency_energy_does_not_depend_on_the_memory_layout():
    rng = np.random.default_rng(0)
    chw = rng.integers(0, 256, (6, 3, 48, 40), dtype=np.uint8)
    strided = chw.transpose(0, 2, 3, 1)  # channels-last view, as a sampler's permute gives
    assert not strided.flags["C_CONTIGUOUS"]
    copy = np.ascontiguousarray(strided)
    assert high_frequency_energy(strided) == high_frequency_energy(copy)
    assert np.array_equal(high_frequency_shares(strided), high_frequency_shares(copy))


def test_the_shapes_measures_repeat_bit_for_bit_whatever_the_thread_count(tmp_path):
    from krea2.curate.shapes import concept_scene, eval_prompt, render, shapes_eval, split_concepts
    from krea2.rl.preference.stage import measure, shapes_preference_reward

    split = split_concepts(0)
    prompts = [eval_prompt(c) for c in split.held_out[:4]]
    targets = [concept_scene(c) for c in split.held_out[:4]]
    rng = np.random.default_rng(1)
    images = np.stack([np.stack([render(t, 64, 64) for _ in range(2)]) for t in targets]).astype(
        np.int16
    )
    images = np.clip(images + rng.integers(-30, 31, images.shape), 0, 255).astype(np.uint8)
    reward = shapes_preference_reward(tmp_path / "artifact-head.pt")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        a = measure(images, prompts, targets, reward)
        torch.set_num_threads(1)
        b = measure(images, prompts, targets, reward)
        c = measure(np.ascontiguousarray(images.transpose(0, 1, 3, 2, 4)).transpose(0, 1, 3, 2, 4),
                    prompts, targets, reward)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert a == b == c
    assert a["shapes_eval"] == shapes_eval(images, targets).score
