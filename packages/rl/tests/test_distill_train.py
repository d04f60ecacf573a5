"""A distillation stage after a finished one, from Python (what a recipe calls): the job
:func:`distill_job` builds continues the teacher's run with objective ``tdm`` and its
settings, :func:`train_distill` links the teacher, trains, and returns at once when done."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from krea2.infra.config import save_config
from krea2.infra.errors import UserError
from krea2.rl.distill import TURBO_STAGE, TdmConfig, distill_job, train_distill
from krea2.trainer import load_job

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import launch_module
from tdm_helpers import distill_job as distill_toml
from tdm_helpers import write_data

SETTINGS = TdmConfig(student_steps=2, teacher_guidance=3.0)


def _teacher(tmp_path: Path):
    """A finished one-stage flow-matching run (the teacher) and the prompt shards."""
    data = write_data(tmp_path / "data")
    job = load_job(distill_toml(tmp_path, data, pretrain_steps=2, every=0))
    teacher = replace(job, stages=job.stages[:1])
    path = tmp_path / "teacher.toml"
    save_config(teacher, path)
    out, _ = (proc := launch_module(1, "krea2.trainer", "--config", str(path))).communicate(
        timeout=300
    )
    assert proc.returncode == 0, out[-3000:]
    return teacher, data["prompts"]


def test_the_turbo_stage_continues_the_teachers_run_and_is_done_once(tmp_path):
    teacher, prompts = _teacher(tmp_path)
    job = distill_job(teacher, 0, tmp_path / "turbo", prompts, SETTINGS, 2, 4, 1e-4, 0)
    stage = job.stages[-1]
    assert [s.name for s in job.stages] == ["pretrain", TURBO_STAGE]
    assert stage.objective == "tdm" and stage.init_from == "previous"
    assert stage.settings["student_steps"] == 2 and stage.settings["teacher_guidance"] == 3.0
    assert (stage.steps, stage.batch_size, stage.lora.enabled) == (2, 4, False)
    save_config(job, tmp_path / "turbo.toml")
    code = (
        "import sys\nfrom krea2.trainer import load_job\n"
        "from krea2.rl.distill import train_distill\n"
        "teacher, job = load_job(sys.argv[1]), load_job(sys.argv[2])\n"
        "print(train_distill(teacher, 0, job))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "teacher.toml"), str(tmp_path / "turbo.toml")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run = tmp_path / "turbo"
    assert (run / "checkpoints" / f"{TURBO_STAGE}.done").exists()
    assert (run / "checkpoints" / "pretrain").is_symlink()  # the teacher, linked, not copied
    saved = load_job(run / "config.toml")
    assert saved.stages[-1].objective == "tdm"  # `krea2 train --config` repeats it
    assert train_distill(teacher, 0, job) == run  # finished: nothing trains again


def test_bad_sizes_and_an_unfinished_teacher_are_user_errors(tmp_path):
    data = write_data(tmp_path / "data")
    job = load_job(distill_toml(tmp_path, data, pretrain_steps=2, every=0))
    teacher = replace(job, stages=job.stages[:1])
    with pytest.raises(UserError, match="stage_index=3"):
        distill_job(teacher, 3, tmp_path / "t", data["prompts"], SETTINGS, 2, 4, 1e-4)
    with pytest.raises(UserError, match="steps=0"):
        distill_job(teacher, 0, tmp_path / "t", data["prompts"], SETTINGS, 0, 4, 1e-4)
    turbo = distill_job(teacher, 0, tmp_path / "t", data["prompts"], SETTINGS, 2, 4, 1e-4)
    with pytest.raises(UserError, match="has not finished"):
        train_distill(teacher, 0, turbo)
