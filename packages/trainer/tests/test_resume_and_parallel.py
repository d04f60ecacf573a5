"""Kill-and-resume gives the uninterrupted loss sequence (1 and 2 ranks), and FSDP / FSDP+TP
on 2 gloo ranks match one process (losses, gradient norms and final weights)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from trainer_test_helpers import (
    held_env,
    job_toml,
    kill_when_held,
    newest_save_at,
    ranks,
    single,
    torchrun,
)

from krea2.trainer.cli import run_job
from krea2.trainer.merge import average
from krea2.trainer.observe import read_metrics
from krea2.trainer.optim import MUON_PATTERN
from krea2.trainer.warmstart import stage_checkpoints

STEPS = 10
EVERY = 3  # job_toml's checkpoint.every: steps 2, 5 and 8 save asynchronously


def _train_rows(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


def _finish(proc, what: str, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{what} failed:\n{out[-3000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shards):
    root = tmp_path_factory.mktemp("runs")

    def job(name: str, extra: str = "") -> Path:
        path = root / f"{name}.toml"
        path.write_text(job_toml(root / name, shards, STEPS, extra))
        return path

    return root, job


@pytest.fixture(scope="module")
def reference(runs):
    root, job = runs
    run_job(job("single"), [], resume=False)
    return _train_rows(root / "single")


@pytest.fixture(scope="module")
def fsdp_reference(runs):
    root, job = runs
    _finish(torchrun(2, job("fsdp")), "2-rank FSDP run")
    return _train_rows(root / "fsdp")


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    last = sorted((run / "checkpoints" / "pretrain").glob("step-*"))[-1]
    return average([last])


def _assert_close_runs(a: list[dict], b: list[dict], tol: float) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(STEPS))
    for ra, rb in zip(a, b, strict=True):
        assert abs(ra["loss"] - rb["loss"]) <= tol * abs(rb["loss"]), (
            ra["step"],
            ra["loss"],
            rb["loss"],
        )
        assert abs(ra["grad_norm"] - rb["grad_norm"]) <= tol * rb["grad_norm"]


def _killed_mid_run(root: Path, name: str, kill: int, nranks: int) -> int:
    """Run ``name`` (on ``nranks`` ranks) until ``kill`` steps are done, hold it there (a pause
    point: it cannot train on or finish first), SIGKILL it once its newest checkpoint begun
    is complete; returns that checkpoint's step."""
    notice = root / f"{name}.paused"
    env = held_env("pretrain", kill, notice)
    cfg = root / f"{name}.toml"
    proc = single(cfg, env=env) if nranks == 1 else ranks(nranks, cfg, env=env)
    saved = newest_save_at(kill, EVERY)
    kill_when_held(proc, notice, stage_checkpoints(root / name, "pretrain"), saved, nranks)
    assert max(r["step"] for r in _train_rows(root / name)) == kill - 1  # logged, then held
    return saved


def test_kill_and_resume_one_rank_repeats_the_loss_sequence(runs, reference):
    root, job = runs
    cfg = job("killed1")
    # steps done at the kill: from after the first checkpoint (step 2) to 3 steps before
    # the end, chosen per run; the state at the kill is exact for each choice
    kill = random.Random(os.getpid()).randint(4, STEPS - 3)
    saved = _killed_mid_run(root, "killed1", kill, 1)
    out = _finish(single(cfg, "--resume"), "resume")
    assert f"resumed stage pretrain at step {saved + 1}" in out
    resumed = _train_rows(root / "killed1")
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in resumed] == [
        (r["step"], r["loss"], r["grad_norm"]) for r in reference
    ], f"killed at step {kill}"


def test_fsdp_on_two_ranks_matches_one_process(runs, reference, fsdp_reference):
    root, _ = runs
    _assert_close_runs(fsdp_reference, reference, 1e-4)
    ref_w, fsdp_w = _final_weights(root / "single"), _final_weights(root / "fsdp")
    worst = max(float((ref_w[k] - fsdp_w[k]).abs().max()) for k in ref_w)
    assert worst < 1e-4


def test_kill_and_resume_two_ranks_repeats_the_loss_sequence(runs, fsdp_reference):
    root, job = runs
    cfg = job("killed2")
    kill = random.Random(os.getpid() + 1).randint(4, STEPS - 3)
    saved = _killed_mid_run(root, "killed2", kill, 2)
    out = _finish(ranks(2, cfg, "--resume"), "2-rank resume")
    assert f"resumed stage pretrain at step {saved + 1}" in out
    resumed = _train_rows(root / "killed2")
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in resumed] == [
        (r["step"], r["loss"], r["grad_norm"]) for r in fsdp_reference
    ], f"killed at step {kill}"


MUON = "[optimizer]\nname = 'muon'\nweight_decay = 0.01\n"


def test_fsdp_plus_tp_with_muon_on_two_ranks_matches_one_process(runs):
    """TP shards every block matrix (Muon orthogonalises the full DTensor matrix), FSDP
    shards over the size-1 dp dimension: losses, grad norms and weights as one process."""
    root, job = runs
    run_job(job("single_muon", MUON), [], resume=False)
    reference = _train_rows(root / "single_muon")
    cfg = job("tp", MUON)
    cfg.write_text(cfg.read_text().replace("[parallel]\n", "[parallel]\ntp = 2\n"))
    _finish(ranks(2, cfg), "2-rank FSDP+TP run")
    _assert_close_runs(_train_rows(root / "tp"), reference, 1e-4)
    ref_w, tp_w = _final_weights(root / "single_muon"), _final_weights(root / "tp")
    # torch.optim.Muon runs Newton-Schulz in bfloat16, so the sharded (DTensor) and dense
    # orthogonalisations agree to bf16 precision only: Muon matrices get a looser bound.
    for k in ref_w:
        bound = 1e-3 if MUON_PATTERN.match(k) else 1e-4
        assert float((ref_w[k] - tp_w[k]).abs().max()) < bound, k
