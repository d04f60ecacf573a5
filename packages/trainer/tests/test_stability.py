"""Spike and NaN guards: detection, skip, rollback past the offending batch, stop with a reason."""

from __future__ import annotations

import json

import pytest

from krea2.trainer import trainer as trainer_mod
from krea2.trainer.cli import run_job
from krea2.trainer.config import StabilityConfig
from krea2.trainer.stability import SpikeDetector


def test_detector_flags_nan_loss_spike_and_grad_spike_only_after_warmup():
    det = SpikeDetector(StabilityConfig(warmup_steps=5, loss_sigma=4.0, grad_factor=5.0))
    assert det.judge(50.0, 1.0).ok  # during warmup anything finite passes
    det = SpikeDetector(StabilityConfig(warmup_steps=5, loss_sigma=4.0, grad_factor=5.0))
    for i in range(10):
        assert det.judge(1.0 + 0.01 * (i % 3), 1.0).ok
    assert det.judge(float("nan"), 1.0).reason == "nan"
    assert det.judge(2.0, 1.0).reason == "loss_spike"
    assert det.judge(1.01, 20.0).reason == "grad_spike"
    assert det.judge(1.01, 1.1).ok and det.consecutive_bad == 0
    clone = SpikeDetector(det.cfg)
    clone.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert clone.judge(2.0, 1.0).reason == "loss_spike"


def _inject_nan(monkeypatch, bad_steps: set[int]):
    real = trainer_mod.Trainer._forward_backward
    hits: list[int] = []

    def step(self, run, batch, step):
        out = real(self, run, batch, step)
        if step in bad_steps and step not in hits:
            hits.append(step)
            out["loss"] = float("nan")
        return out

    monkeypatch.setattr(trainer_mod.Trainer, "_forward_backward", step)
    return hits


def test_rollback_reloads_the_last_checkpoint_and_skips_the_bad_batch(
    write_job, tmp_path, monkeypatch
):
    hits = _inject_nan(monkeypatch, {7})
    job = write_job("rb", steps=10, extra="[stability]\naction = 'rollback'\nwarmup_steps = 1000\n")
    job.write_text(job.read_text().replace("[stability]\nwarmup_steps = 1000\n", "", 1))
    run_job(job, [], resume=False)
    assert hits == [7]
    last = tmp_path / "rb" / "checkpoints" / "pretrain" / "step-000000009"
    extra = json.loads((last / "extra-rank00000.json").read_text())
    assert extra["skip"] == [7]
    log = (tmp_path / "rb" / "train.log.jsonl").read_text()
    assert "rolled back to step 5" in log and "skipping batch marked bad" in log


def test_repeated_bad_steps_stop_the_run_with_the_reason(write_job, monkeypatch):
    _inject_nan(monkeypatch, set(range(3, 20)))
    job = write_job("stop", steps=10, extra="")
    job.write_text(
        job.read_text().replace(
            "warmup_steps = 1000\n", "warmup_steps = 1000\nmax_bad_steps = 2\n", 1
        )
    )
    with pytest.raises(trainer_mod.TrainingStopped, match=r"3 bad steps in a row \(last: nan"):
        run_job(job, [], resume=False)
