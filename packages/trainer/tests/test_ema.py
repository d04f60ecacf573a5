"""A stage's weight EMA (``ema_decay``): its result is the average, and a resume repeats it."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from krea2.trainer import WeightEma
from krea2.trainer.cli import run_job


def _checkpoint(run, step: int, tmp_path) -> dict:
    out = tmp_path / f"ckpt-{run.name}-{step}.pt"
    dcp_to_torch_save(run / "checkpoints" / "pretrain" / f"step-{step:09d}", out)
    return torch.load(out, weights_only=False)


def _ema_job(write_job, name: str, decay: float):
    job = write_job(name, steps=6)
    text = job.read_text().replace("batch_size = 8\n", f"batch_size = 8\nema_decay = {decay}\n", 1)
    job.write_text(text)
    return job


def test_weight_ema_update_copy_and_state():
    p = torch.nn.Parameter(torch.zeros(3))
    ema = WeightEma([p])
    with torch.no_grad():
        p.add_(4.0)
    ema.update(0.75)  # 0.75 * 0 + 0.25 * 4
    torch.testing.assert_close(ema.old[0], torch.ones(3))
    ema.copy_to_params()
    assert torch.equal(p.detach(), torch.ones(3))
    with pytest.raises(ValueError, match="decay"):
        ema.update(1.0)
    with pytest.raises(ValueError, match="expected 1"):
        ema.load_state_dict({})


def test_a_stage_with_ema_ends_on_the_average_and_a_resume_repeats_it(write_job, tmp_path):
    plain = write_job("plain", steps=6)
    run_job(plain, [], resume=False)
    job = _ema_job(write_job, "ema", 0.5)
    run_job(job, [], resume=False)
    run = tmp_path / "ema"
    final = _checkpoint(run, 5, tmp_path)
    model = [v for k, v in sorted(final["model"].items()) if torch.is_floating_point(v)]
    # the result is the average: the checkpoint's weights are its EMA tensors
    assert sorted(final["ema"]) and len(final["ema"]) == len(final["optim"]["state"])
    for t in final["ema"].values():
        assert any(t.shape == m.shape and torch.equal(t, m) for m in model)
    # ... and not the last step's weights (the run without an EMA ends elsewhere)
    other = _checkpoint(tmp_path / "plain", 5, tmp_path)["model"]
    assert any(not torch.equal(final["model"][k], other[k]) for k in other)
    # mid-stage checkpoints keep the trained weights and the average apart
    mid = _checkpoint(run, 2, tmp_path)
    mid_model = [v for v in mid["model"].values() if torch.is_floating_point(v)]
    assert any(not any(torch.equal(t, m) for m in mid_model) for t in mid["ema"].values())
    # kill the run after step 2: the resume loads the average with the weights and repeats
    again = tmp_path / "again"
    shutil.copytree(run, again)
    shutil.rmtree(again / "checkpoints" / "pretrain" / f"step-{5:09d}")
    (again / "checkpoints" / "pretrain.done").unlink()
    job.write_text(job.read_text().replace(str(run), str(again)))
    run_job(job, [], resume=True)
    resumed = _checkpoint(again, 5, tmp_path)
    for k, v in final["model"].items():
        assert torch.equal(v, resumed["model"][k]), k


def test_ema_decay_out_of_range_is_refused():
    from krea2.trainer import StageConfig

    with pytest.raises(ValueError, match="ema_decay"):
        StageConfig(ema_decay=1.0)
