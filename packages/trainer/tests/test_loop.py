"""The single-process loop: it learns, logs, saves its run info, chains stages, refuses reruns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from krea2.infra.errors import UserError
from krea2.trainer.cli import run_job
from krea2.trainer.observe import read_metrics

SAMPLES = """
[observe]
sample_prompts = ["a red square in the center", "a blue disc in the top left"]
sample_seeds = [0, 1]
sample_steps = 4
peak_tflops = 0.2
"""


def test_toy_run_lowers_loss_and_writes_metrics_samples_and_run_info(write_job, tmp_path):
    job = write_job("run", steps=24, extra=SAMPLES)
    run_job(job, [], resume=False)
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(24))
    first, last = train[0], train[-1]
    assert sum(r["loss"] for r in train[-4:]) / 4 < 0.7 * first["loss"]
    for key in ("grad_norm", "lr", "samples_per_second", "tokens_per_second", "mfu", "step_time"):
        assert last[key] is not None and last[key] > 0
    assert any(r[f"loss_t{b}"] is not None for r in train for b in range(4))
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and evals[-1]["eval_loss"] < first["loss"]
    grid = run / "samples" / "pretrain-000023.png"
    assert grid.exists()
    assert json.loads(grid.with_suffix(".json").read_text())["prompts"][1].startswith("a blue")
    info = json.loads((run / "run.json").read_text())
    assert "git_commit" in info["code"] and info["environment"]["world_size"] == 1
    assert "[[stages]]" in (run / "config.toml").read_text()


def test_existing_run_is_not_overwritten_without_resume(write_job):
    job = write_job("again", steps=3)
    run_job(job, [], resume=False)
    with pytest.raises(UserError, match="pass --resume"):
        run_job(job, [], resume=False)


def test_a_run_records_absolute_paths_and_samples_from_any_directory(tmp_path, shards, monkeypatch):
    import os
    import shutil

    from trainer_test_helpers import job_toml

    from krea2.infra.config import load_config
    from krea2.trainer.config import JobConfig
    from krea2.trainer.inference import load_run, sample_stage

    work = tmp_path / "work"
    shutil.copytree(shards["train"], work / "shards")
    (work / "job.toml").write_text(job_toml(Path("runs/rel"), {"train": Path("shards"),
                                   "eval": Path("shards")}, steps=2))  # fmt: skip
    monkeypatch.chdir(work)
    run_job(Path("job.toml"), [], resume=False)
    saved = load_config(JobConfig, work / "runs" / "rel" / "config.toml")
    assert saved.run_dir == work / "runs" / "rel"
    assert saved.stages[0].data == [str(work / "shards")]
    monkeypatch.chdir(tmp_path)  # elsewhere: the run still finds its shards and checkpoints
    job = load_run(Path(os.path.relpath(work / "runs" / "rel")))
    assert sample_stage(job, 0, ["blob 1 in cell 2"], [0], steps=2, cfg_scale=1.0).shape[:2] == (
        1,
        1,
    )


def test_a_finished_stage_is_extended_only_when_asked(write_job, tmp_path):
    job = write_job("extend", steps=3)
    run_job(job, [], resume=False)
    with pytest.raises(
        UserError, match=r"finished at 3 steps .* asks for 5: pass --resume --extend"
    ):
        run_job(job, ["stages.0.steps=5"], resume=True)
    with pytest.raises(UserError, match="use it with --resume"):
        run_job(job, ["stages.0.steps=5"], resume=False, extend=True)
    run_job(job, ["stages.0.steps=5"], resume=True, extend=True)
    rows = [r for r in read_metrics(tmp_path / "extend" / "metrics.jsonl") if r["kind"] == "train"]
    assert sorted({r["step"] for r in rows}) == [0, 1, 2, 3, 4]  # continued, not restarted
    assert (tmp_path / "extend" / "checkpoints" / "pretrain.done").read_text().strip() == "5"
    run_job(job, ["stages.0.steps=5"], resume=True)  # finished at 5 now: nothing to do


def test_a_recipe_chains_stages_from_the_previous_weights(write_job, tmp_path, shards):
    two = f"""
[[stages]]
name = "second"
data = ["{shards["train"]}"]
steps = 3
batch_size = 8
lr = 1e-4
[stages.schedule]
warmup_steps = 0
"""
    job = write_job("chain", steps=16, extra="")
    job.write_text(job.read_text() + two)
    run_job(job, [], resume=False)
    rows = [r for r in read_metrics(tmp_path / "chain" / "metrics.jsonl") if r["kind"] == "train"]
    first = [r["loss"] for r in rows if r["stage"] == "pretrain"]
    second = [r["loss"] for r in rows if r["stage"] == "second"]
    assert len(second) == 3
    # Started from the trained weights: far below the first stage's random-init loss.
    assert max(second) < 0.8 * first[0]
    assert (tmp_path / "chain" / "checkpoints" / "second.done").exists()


def test_a_finished_stage_samples_like_the_trainers_own_grid(write_job, tmp_path):
    from krea2.infra.config import load_config
    from krea2.trainer.config import JobConfig
    from krea2.trainer.inference import load_stage_module, sample_stage

    path = write_job("infer", steps=4)
    job = load_config(JobConfig, path, [])
    with pytest.raises(UserError, match="no complete checkpoint"):
        load_stage_module(job, 0, trained=True)
    untrained = load_stage_module(job, 0, trained=False)
    run_job(path, [], resume=False)
    trained = load_stage_module(job, 0, trained=True)
    moved = [
        (a - b).abs().max().item()
        for a, b in zip(untrained.parameters(), trained.parameters(), strict=True)
    ]
    assert max(moved) > 0 and not untrained.training and not trained.training
    prompts = ["a red square in the center", "a blue circle in the top left"]
    images = sample_stage(job, 0, prompts, [0, 1], steps=3, cfg_scale=2.0)
    assert images.shape == (2, 2, 32, 32, 3) and images.dtype == np.uint8
    again = sample_stage(job, 0, prompts, [0, 1], steps=3, cfg_scale=2.0)
    assert np.array_equal(images, again)  # fixed seeds: the same pixels every time
    assert not np.array_equal(images[:, 0], images[:, 1])


def test_a_stage_with_a_doubled_patch_starts_as_the_upsampled_previous_model(
    write_job, tmp_path, shards
):
    import torch
    import torch.nn.functional as F

    from krea2.infra.config import load_config
    from krea2.trainer.build import build_module
    from krea2.trainer.config import JobConfig
    from krea2.trainer.distributed import init_distributed
    from krea2.trainer.inference import load_stage_module, sample_stage
    from krea2.trainer.testing import write_toy_shards
    from krea2.trainer.warmstart import warm_start

    write_toy_shards(tmp_path / "s64", 16, size=(64, 64), files=1, batch_size=8, seed=3)
    high = f"""
[[stages]]
name = "high"
data = ["{tmp_path / "s64"}"]
resolution = 64
patch = 8
steps = 2
batch_size = 8
[stages.schedule]
warmup_steps = 0
"""
    path = write_job("patch", steps=3)
    path.write_text(path.read_text() + high)
    run_job(path, [], resume=False)
    rows = [r for r in read_metrics(tmp_path / "patch" / "metrics.jsonl") if r["kind"] == "train"]
    tokens = {r["stage"]: r["image_tokens"] for r in rows}
    assert tokens == {"pretrain": 64, "high": 64}  # 32 px / 4 and 64 px / 8: one token grid

    job = load_config(JobConfig, path, [])
    low = load_stage_module(job, 0, trained=True)
    start = build_module(job, job.stages[1], init_distributed(job))
    warm_start(job, 1, start, distributed=False)
    assert start.dit.first.weight.shape[1] == 3 * 8 * 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 32, 32, generator=g)
    t = torch.tensor([0.4, 0.9])
    captions = ["a green square in the center", "a blue circle"]
    with torch.no_grad():
        v_low, _ = low(x, t, captions)
        v_high, _ = start.eval()(F.interpolate(x, scale_factor=2, mode="nearest"), t, captions)
    up = F.interpolate(v_low, scale_factor=2, mode="nearest")
    torch.testing.assert_close(v_high, up, rtol=1e-4, atol=1e-4)
    images = sample_stage(job, 1, captions, [0], steps=2, cfg_scale=2.0)
    assert images.shape == (2, 1, 64, 64, 3)


def test_seeds_sharing_a_forward_sample_the_images_of_one_seed_at_a_time(write_job, monkeypatch):
    from krea2.infra.config import load_config
    from krea2.trainer import evaluate
    from krea2.trainer.config import JobConfig
    from krea2.trainer.inference import sample_stage

    assert evaluate.seeds_per_forward(56, 64, 8) == 8  # the toy's eval: all seeds at once
    assert evaluate.seeds_per_forward(56, 4096, 8) == 1  # 1024 px: one seed, as before
    assert evaluate.seeds_per_forward(10**6, 10**6, 3) == 1
    path = write_job("chunks", steps=2)
    run_job(path, [], resume=False)
    job = load_config(JobConfig, path, [])
    prompts = ["a red square in the center", "a blue circle in the top left"]
    calls: list[int] = []
    together = sample_stage(job, 0, prompts, [0, 1, 2], 3, 2.0, on_step=lambda: calls.append(1))
    assert len(calls) == 3 * 3  # on_step still follows each seed's Euler steps
    monkeypatch.setattr(evaluate, "SAMPLE_TOKENS_PER_FORWARD", 1)
    alone = sample_stage(job, 0, prompts, [0, 1, 2], 3, 2.0)
    assert together.shape == alone.shape == (2, 3, 32, 32, 3)
    # the same pixels up to the last bit of a matmul blocked for another batch size
    assert np.abs(together.astype(int) - alone).max() <= 2
    assert (together == alone).mean() > 0.99
