"""configs/toy/pretrain.toml runs from a command that builds its data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from krea2.trainer.config import load_job

KREA2 = str(Path(sys.executable).parent / "krea2")
REPO = Path(__file__).resolve().parents[3]


def test_toy_data_builds_what_the_toy_recipe_reads(tmp_path):
    os.symlink(REPO / "configs", tmp_path / "configs")
    built = subprocess.run(
        [KREA2, "train", "toy-data", "data/toy", "--rows", "128", "--eval-rows", "16"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    assert "128 rows in data/toy/blobs-64" in built.stdout
    recipe = tmp_path / "configs" / "toy" / "pretrain.toml"
    assert "krea2 train toy-data data/toy" in recipe.read_text()  # the header says how
    checked = subprocess.run(
        [KREA2, "train", "--config", "configs/toy/pretrain.toml", "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    # The samples the recipe draws ask for what the data shows.
    job = load_job(recipe)
    assert all(p.startswith("blob ") for p in job.observe.sample_prompts)


def test_toy_data_names_a_bad_option(tmp_path):
    bad = subprocess.run(
        [KREA2, "train", "toy-data", str(tmp_path / "d"), "--sides", "32,big"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "error: --sides '32,big'" in bad.stderr
