"""From a trained run to an image: `krea2 train sample` uses the run's own conditioning,
and exported weights record it so `krea2 dit sample` refuses what it cannot rebuild."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

KREA2 = str(Path(sys.executable).parent / "krea2")
PROMPTS = ["blob 3 in cell 4", "blob 0 in cell 0"]


def krea2(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KREA2_PROGRESS": "plain"}
    return subprocess.run([KREA2, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def run(tmp_path_factory, shards) -> Path:
    from trainer_test_helpers import job_toml

    from krea2.trainer.cli import run_job

    root = tmp_path_factory.mktemp("sample")
    job = root / "job.toml"
    job.write_text(job_toml(root / "run", shards, steps=9))
    run_job(job, [], resume=False)
    return root / "run"


def test_train_sample_writes_the_runs_own_images_and_a_labelled_grid(run, tmp_path):
    from krea2.trainer.inference import load_run, sample_stage

    out = tmp_path / "samples"
    args = ["--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--seeds", "0,1", "--steps", "4"]
    result = krea2("train", "sample", str(run), *args, "--step", "5", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "sample pretrain: 8/8 step (100%)" in result.stderr  # steps x seeds
    expected = sample_stage(load_run(run), 0, PROMPTS, [0, 1], steps=4, cfg_scale=2.0, step=5)
    for i in range(2):
        for j, seed in enumerate((0, 1)):
            image = np.asarray(Image.open(out / f"p{i:02d}-s{seed}.png"))
            assert np.array_equal(image, expected[i, j])
    info = json.loads((out / "grid.json").read_text())
    assert info["prompts"] == PROMPTS and info["stage"] == "pretrain" and info["step"] == 5
    assert info["conditioning"]["text_encoder"] == "trainer:words"
    grid = np.asarray(Image.open(out / "grid.png"))
    tiles_only = 2 * 256 + 3 * 4  # two rows of 256-px tiles and their padding
    assert grid.shape[0] > tiles_only  # room for a line of text under each row
    under_first_row = grid[4 + 256 + 4 : 4 + 256 + 4 + 18]
    assert (under_first_row < 128).any()  # dark text pixels: the prompt is written there


def test_train_sample_draws_the_size_asked_for_and_refuses_one_off_the_grid(run, tmp_path):
    from krea2.trainer.inference import load_run, sample_run

    side = load_run(run).stages[0].resolution
    out = tmp_path / "wide"
    sample_run(run, PROMPTS[:1], out, seeds=[0], steps=2, size=(2 * side, side))
    image = np.asarray(Image.open(out / "p00-s0.png"))
    assert image.shape == (side, 2 * side, 3)  # height, width
    assert json.loads((out / "grid.json").read_text())["size"] == [2 * side, side]
    bad = krea2("train", "sample", str(run), "-p", "x", "--size", f"{side + 1}x{side}",
                "--out", str(tmp_path / "bad"))  # fmt: skip
    assert bad.returncode == 2 and f"--size {side + 1}x{side}: width and height must be" in (
        bad.stderr
    )
    assert "Traceback" not in bad.stderr and not (tmp_path / "bad").exists()


def test_train_sample_names_what_is_missing(run, tmp_path):
    bad_stage = krea2("train", "sample", str(run), "--stage", "p99", "-p", "x", "--out", "o")
    assert bad_stage.returncode == 2
    assert (
        "error: --stage 'p99' is not a stage" in bad_stage.stderr and "pretrain" in bad_stage.stderr
    )
    bad_step = krea2("train", "sample", str(run), "--step", "4", "-p", "x", "--out", "o")
    assert bad_step.returncode == 2 and "its checkpoints are steps [2, 5, 8]" in bad_step.stderr
    not_a_run = krea2("train", "sample", str(tmp_path), "-p", "x", "--out", "o")
    assert not_a_run.returncode == 2 and "has no config.toml" in not_a_run.stderr
    for result in (bad_stage, bad_step, not_a_run):
        assert "Traceback" not in result.stderr


def test_pma_records_the_runs_conditioning_and_dit_sample_refuses_it(run, tmp_path):
    from krea2.dit.weights import read_conditioning

    pma = tmp_path / "pma.safetensors"
    result = krea2(
        "train", "pma", str(run), "--stage", "pretrain", "--last", "2", "--every", "3",
        "--out", str(pma),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = read_conditioning(pma)
    assert record["text_encoder"] == "trainer:words"
    assert record["prediction"] == "velocity" and record["shift"] is None
    assert record["text_tokens"] == 16 and record["autoencoder"] == "pixel"
    refused = krea2("dit", "sample", "--weights", str(pma), "--prompt", "x", "--out", "o")
    assert refused.returncode == 2, refused.stderr
    assert "trainer:words" in refused.stderr and "krea2 train sample" in refused.stderr


def test_merge_records_the_shift_of_the_stage_its_folders_come_from(run, tmp_path):
    from krea2.dit.weights import read_conditioning
    from krea2.infra.errors import UserError
    from krea2.trainer.merge import merge_to_file

    root = run / "checkpoints" / "pretrain"
    second = '\n[[stages]]\nname = "hi"\ndata = ["x"]\ntime_shift = 1.2\n'
    job = tmp_path / "job.toml"
    job.write_text(
        (run / "config.toml")
        .read_text()
        .replace('name = "pretrain"', 'name = "pretrain"\ntime_shift = 0.8')
        + second
    )
    steps = [root / "step-000000002", root / "step-000000005"]
    out = merge_to_file(steps, None, job, tmp_path / "m.safetensors")
    assert read_conditioning(out)["shift"] == 0.8
    with pytest.raises(UserError, match="different time shifts"):
        merge_to_file([out], None, job, tmp_path / "again.safetensors")


def test_a_checkpoint_folder_from_outside_the_run_is_loaded_only_when_trusted(run, tmp_path):
    import shutil

    from krea2.infra.errors import UserError
    from krea2.trainer.merge import merge_to_file

    foreign = tmp_path / "downloaded" / "step-000000005"
    shutil.copytree(run / "checkpoints" / "pretrain" / "step-000000005", foreign)
    job = run / "config.toml"
    with pytest.raises(UserError, match=r"outside this run .*--trust-checkpoints"):
        merge_to_file([foreign], None, job, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()  # refused before anything was read
    out = merge_to_file([foreign], None, job, tmp_path / "m.safetensors", trusted=True)
    again = merge_to_file([out], None, job, tmp_path / "again.safetensors")  # no code inside
    assert again.exists()


def test_train_export_writes_the_release_file_and_names_what_a_pipeline_needs(run, tmp_path):
    from krea2.dit.weights import read_checkpoint, read_conditioning

    out = tmp_path / "raw.safetensors"
    result = krea2("train", "export", str(run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert read_conditioning(out)["text_encoder"] == "trainer:words"
    assert read_checkpoint(out)[1] is not None  # the DiT config travels with the weights
    again = krea2("train", "export", str(run), "--out", str(out))
    assert again.returncode != 0 and "exists; pass --force" in again.stderr
    folder = krea2(
        "train", "export", str(run), "--layout", "diffusers", "--out", str(tmp_path / "d")
    )
    assert folder.returncode != 0 and "--layout release instead" in folder.stderr
    assert not (tmp_path / "d").exists()
