"""Distillation as trainer stages: one TOML job, flow matching → ``tdm`` (a full-copy fake
score) → ``dmd2`` (a LoRA fake score) → ``tdm`` with a LoRA student whose fake score is a
second adapter on its base (the teacher: that base, adapters off), run by ``krea2 train
--config``. 2 gloo ranks equal 1 rank; a SIGKILL mid-``tdm`` resumes to the same losses,
the fake score's weights and AdamW moments included, for both layouts."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from krea2.infra.errors import UserError
from krea2.trainer import load_job, validate_job

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import held_env, kill_when_held, launch_module, newest_save_at
from tdm_helpers import distill_job, train_rows, write_data

TDM_STEPS, DMD2_STEPS, LORA_STEPS = 4, 2, 4
# A fast fake score (lr 1e-3) so its state visibly shapes every later step's numbers.
TDM_SETTINGS = "student_steps = 2\nteacher_guidance = 3.0\nfake_lr = 1e-3"
ABLATION = f"""
[[stages]]
name = "ablation"
objective = "dmd2"
data = ["PROMPTS/*.parquet"]
steps = {DMD2_STEPS}
batch_size = 4
lr = 1e-4
[stages.schedule]
warmup_steps = 0
[stages.settings]
student_steps = 2
fake = "lora"
fake_lora_rank = 4
fake_updates = 2
fake_lr = 1e-3

[[stages]]
name = "lora-student"
objective = "tdm"
data = ["PROMPTS/*.parquet"]
steps = {LORA_STEPS}
batch_size = 4
lr = 1e-3
[stages.schedule]
warmup_steps = 0
[stages.lora]
rank = 4
[stages.settings]
student_steps = 2
teacher_guidance = 3.0
fake = "adapter"
fake_lora_rank = 2
fake_lr = 1e-3
"""
COMPARED = ("loss", "grad_norm", "fake_loss", "teacher_fake_gap", "dm_grad_norm")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_data(tmp_path_factory.mktemp("tdm-data"))


def _job(root: Path, data: dict[str, Path], settings: str = TDM_SETTINGS) -> Path:
    extra = ABLATION.replace("PROMPTS", str(data["prompts"]))
    return distill_job(root, data, tdm_steps=TDM_STEPS, settings=settings, extra_stages=extra)


def _launch(nproc: int, config: Path, *args: str, env: dict[str, str] | None = None):
    return launch_module(nproc, "krea2.trainer", "--config", str(config), *args, env=env)


@pytest.fixture(scope="module")
def one_rank_root(tmp_path_factory, data) -> Path:
    """The folder of the job run once on one rank (its ``run`` and ``job.toml``)."""
    root = tmp_path_factory.mktemp("tdm-1")
    krea2 = Path(sys.executable).with_name("krea2")  # the console command a user types
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([str(krea2), "train", "--config", str(_job(root, data))],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return root


@pytest.fixture(scope="module")
def one_rank(one_rank_root) -> dict[tuple[str, int], dict]:
    return train_rows(one_rank_root / "run")


def test_krea2_train_runs_flow_then_tdm_then_dmd2(one_rank):
    assert sorted({s for s, _ in one_rank}) == ["ablation", "lora-student", "pretrain", "turbo"]
    for step in range(TDM_STEPS):
        row = one_rank[("turbo", step)]
        for name in (*COMPARED, "fake_grad_norm", "cfg_term", "dmd_normaliser", "x0_rms"):
            assert math.isfinite(row[name]), (step, name)
        assert row["is_weight"] > 0 and 0 <= row["is_weight_clipped"] <= 1
        assert row["cfg_term"] > 0  # the teacher runs with CFG (krea2 scale 2)
    # the fake score starts as the teacher and learns the student's samples from there
    gaps = [one_rank[("turbo", s)]["teacher_fake_gap"] for s in range(TDM_STEPS)]
    assert gaps[-1] > gaps[0] > 0
    for step in range(DMD2_STEPS):  # DMD2: fresh Gaussian noise only, weights exactly 1
        row = one_rank[("ablation", step)]
        assert row["is_weight"] == pytest.approx(1.0) and math.isfinite(row["loss"])


def test_a_lora_student_and_its_fake_score_are_two_adapters_on_the_teacher(one_rank, one_rank_root):
    """The last stage keeps one DiT: the student's adapter, the fake's adapter and, with
    both off, the frozen teacher (its start: the ablation stage's weights)."""
    import torch

    from krea2.trainer import load_stage_module
    from krea2.trainer.checkpoint_tensors import read_adapter, tensor_keys

    for step in range(LORA_STEPS):
        row = one_rank[("lora-student", step)]
        for name in (*COMPARED, "fake_grad_norm", "cfg_term"):
            assert math.isfinite(row[name]) and row[name] > 0, (step, name)
    gaps = [one_rank[("lora-student", s)]["teacher_fake_gap"] for s in range(LORA_STEPS)]
    assert gaps[-1] > gaps[0] > 0  # the fake adapter learns away from the teacher
    run = one_rank_root / "run"
    step_dir = run / "checkpoints" / "lora-student" / f"step-{LORA_STEPS - 1:09d}"
    keys = tensor_keys(step_dir, "")
    fake = [k for k in keys if ".lora_A.fake." in k or ".lora_B.fake." in k]
    assert fake and not [k for k in keys if k.startswith("model.dit.") and ".lora_" not in k]
    assert any(k.startswith("objective.fake_exp_avg.") for k in keys)  # the fake's moments
    adapter = read_adapter(step_dir)  # the student's adapter alone, in released names
    assert adapter and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in adapter)
    assert {v.shape[0] for k, v in adapter.items() if ".lora_A." in k} == {4}
    # the stage's model is its start plus the student's adapter, merged
    job = load_job(one_rank_root / "job.toml")
    start, tuned = load_stage_module(job, 2), load_stage_module(job, 3)
    x, t = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.rand(2)
    with torch.no_grad():
        a, b = start(x, t, ["blob 1 in cell 2", ""])[0], tuned(x, t, ["blob 1 in cell 2", ""])[0]
    assert not torch.allclose(a, b, atol=1e-6)


def test_two_gloo_ranks_equal_one(tmp_path, data, one_rank):
    out, _ = (proc := _launch(2, _job(tmp_path, data))).communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    two = train_rows(tmp_path / "run")
    assert sorted(two) == sorted(one_rank)
    for key, a in one_rank.items():
        for name in COMPARED:
            if name in a:
                assert two[key][name] == pytest.approx(a[name], rel=1e-4, abs=1e-7), (key, name)


@pytest.mark.parametrize("stage", ["turbo", "lora-student"])
def test_sigkill_mid_stage_resumes_to_the_same_losses(tmp_path, data, one_rank, stage):
    """Mid ``turbo`` the fake score is a full copy (its weights and AdamW moments are the
    objective's state); mid ``lora-student`` it is the second adapter (its weights in the
    stage's checkpoint beside the student's, its moments the objective's). Either way the
    resumed run repeats the uninterrupted one, the stages after it included (their AdamW
    from step 0)."""
    config = _job(tmp_path, data)
    notice, saved = tmp_path / "paused", newest_save_at(3, every=1)
    proc = _launch(1, config, env=held_env(stage, 3, notice))
    kill_when_held(proc, notice, tmp_path / "run" / "checkpoints" / stage, saved)
    out, _ = (proc := _launch(1, config, "--resume")).communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert f"resumed stage {stage} at step {saved + 1}" in out
    rows = train_rows(tmp_path / "run")
    assert sorted(rows) == sorted(one_rank)
    for key, a in one_rank.items():
        for name in COMPARED:
            if name in a:
                assert rows[key][name] == pytest.approx(a[name], rel=1e-5, abs=1e-9), (key, name)


def test_settings_are_tdms_own_config_with_clear_refusals(tmp_path, data):
    def problem(settings: str = TDM_SETTINGS, overrides: tuple[str, ...] = ()) -> str:
        with pytest.raises(UserError) as err:
            validate_job(load_job(_job(tmp_path, data, settings), list(overrides)), 1)
        return str(err.value)

    assert "stages.1.settings.studnet_steps" in problem("studnet_steps = 2")
    assert "'tdm'" in problem('mode = "dmd2"')  # the name fixes the mode
    assert "teacher_guidance=1" in problem("teacher_guidance = 0.0")
    lora_copy = problem(overrides=("stages.1.lora.rank=4",))
    assert 'stages.1.settings.fake = "adapter"' in lora_copy and "LoRA student" in lora_copy
    assert "stages.1.lora" in problem('fake = "adapter"')  # an adapter needs a LoRA student
