"""Fixtures for the trainer tests: small synthetic shards and job configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from krea2.trainer.testing import write_toy_shards

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> dict[str, Path]:
    """Train (96 rows, 2 files) and held-out (16 rows) shards of 32x32 scenes."""
    root = tmp_path_factory.mktemp("shards")
    write_toy_shards(root / "train", 96, files=2, batch_size=8, seed=0)
    write_toy_shards(root / "eval", 16, files=1, batch_size=8, seed=99)
    return {"train": root / "train", "eval": root / "eval"}


def job_toml(run_dir: Path, shards: dict[str, Path], steps: int = 10, extra: str = "") -> str:
    """A tiny deterministic job (toy DiT narrowed to 2 blocks, batch 8, 1 thread)."""
    return f"""
run_dir = "{run_dir}"
seed = 0
[model]
name = "toy"
[model.overrides]
depth = 2
width = 64
mlp_hidden = 128
time_dim = 64
text_dim = 32
text_mlp_hidden = 64
[text]
max_tokens = 16
[parallel]
threads = 1
deterministic = true
[data]
workers = 0
[checkpoint]
every = 3
keep_last = 10
[stability]
warmup_steps = 1000
{extra}
[[stages]]
name = "pretrain"
data = ["{shards["train"]}"]
eval_data = ["{shards["eval"]}"]
steps = {steps}
batch_size = 8
[stages.schedule]
warmup_steps = 2
"""


@pytest.fixture
def write_job(tmp_path, shards):
    def write(
        name: str = "job", steps: int = 10, extra: str = "", run_dir: Path | None = None
    ) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(job_toml(run_dir or tmp_path / name, shards, steps, extra))
        return path

    return write


def torchrun(nproc: int, config: Path, *args: str, timeout: float = 300) -> subprocess.Popen:
    """Start ``python -m krea2.trainer`` under torchrun (gloo on CPU)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "krea2.trainer",
        "--config",
        str(config),
        *args,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def single(config: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "krea2.trainer", "--config", str(config), *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
