"""Fixtures for the trainer tests: small synthetic shards and job configs."""

from __future__ import annotations

import os
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


sys.path.insert(0, str(Path(__file__).parent))  # trainer_test_helpers, under importlib mode

from trainer_test_helpers import job_toml  # noqa: E402


@pytest.fixture
def write_job(tmp_path, shards):
    def write(
        name: str = "job", steps: int = 10, extra: str = "", run_dir: Path | None = None
    ) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(job_toml(run_dir or tmp_path / name, shards, steps, extra))
        return path

    return write
