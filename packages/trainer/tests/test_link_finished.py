"""A run that continues another links the stages it starts from: the stage itself and, as
a LoRA stage's checkpoint is adapters on the stage before it, the earlier stages the source
holds; marks them done; and refuses an unfinished stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from krea2.infra.errors import UserError
from krea2.trainer import link_finished, load_job
from krea2.trainer.testing import tiny_job_head


def _source(tmp_path: Path):
    path = tmp_path / "job.toml"
    path.write_text(
        tiny_job_head(tmp_path / "src")
        + """
[[stages]]
name = "base"
data = ["x/*.parquet"]
init_from = "none"
steps = 2
[[stages]]
name = "adapted"
data = ["x/*.parquet"]
steps = 2
[stages.lora]
rank = 4
"""
    )
    job = load_job(path)
    job.run_dir = tmp_path / "src"
    for name in ("base", "adapted"):
        (tmp_path / "src" / "checkpoints" / name / "step-000000001").mkdir(parents=True)
    return job


def test_a_lora_stage_is_linked_with_the_stage_its_adapters_apply_to(tmp_path):
    job = _source(tmp_path)
    with pytest.raises(UserError, match="has not finished"):
        link_finished(job, 1, tmp_path / "next")
    (tmp_path / "src" / "checkpoints" / "adapted.done").write_text("2\n")
    (tmp_path / "next" / "checkpoints" / "base").mkdir(parents=True)  # an earlier attempt's
    link_finished(job, 1, tmp_path / "next")
    target = tmp_path / "next" / "checkpoints"
    for name in ("base", "adapted"):
        assert (target / name).is_symlink(), name
        assert (target / name).resolve() == (tmp_path / "src" / "checkpoints" / name).resolve()
        assert (target / f"{name}.done").read_text() == "2\n"
    link_finished(job, 1, tmp_path / "next")  # again: nothing changes
    assert (target / "adapted").is_symlink()
