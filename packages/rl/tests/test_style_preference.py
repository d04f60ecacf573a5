"""Preference optimization of a style-reference module (#42 item 4): a stage with
``style_from`` fine-tunes the module an earlier style stage trained, alone on the frozen
base, by STPO on pairs that carry the reference both images were sampled with (the
shards' ``reference`` column). Run by ``krea2 train --config``: pretrain -> style -> STPO."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from krea2.infra.errors import UserError
from krea2.rl.preference import export_pair_shards
from krea2.trainer import load_job, read_metrics, stage_style_path, validate_job
from krea2.trainer.testing import tiny_job_head

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import toy_pairs

KREA2 = str(Path(sys.executable).parent / "krea2")
PO_STEPS = 6


def _with_references(root: Path, pairs: list) -> list:
    """Each pair with a style reference: a 48 px image of one of two background colours
    (any size: the loader resizes it to the bucket)."""
    out = []
    for i, pair in enumerate(pairs):
        path = root / f"ref-{i % 2}.png"
        if not path.exists():
            colour = (120, 20, 30) if i % 2 else (10, 110, 120)
            Image.fromarray(np.full((48, 48, 3), colour, np.uint8)).save(path)
        out.append(replace(pair, reference_uri=f"file://{path}"))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("style-pairs")
    pairs = toy_pairs(root / "png", 16)
    styled, plain = root / "styled", root / "plain"
    export_pair_shards(_with_references(root, pairs), styled, side=32, pairs_per_batch=4)
    export_pair_shards(pairs, plain, side=32, pairs_per_batch=4)
    return {"styled": styled, "plain": plain}


def _toml(root: Path, data: dict[str, Path], po_data: str = "styled", style_from: str = "style"):
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.toml"
    path.write_text(
        tiny_job_head(root / "run", every=0)
        + f"""[[stages]]
name = "pretrain"
data = ["{data["plain"]}/*.parquet"]
init_from = "none"
steps = 2
batch_size = 8
[[stages]]
name = "style"
objective = "style"
data = ["{data["plain"]}/*.parquet"]
steps = 2
batch_size = 8
lr = 1e-3
[stages.schedule]
warmup_steps = 0
[[stages]]
name = "style-po"
objective = "stpo"
style_from = "{style_from}"
data = ["{data[po_data]}/*.parquet"]
steps = {PO_STEPS}
batch_size = 8
lr = 3e-3
caption_weights = {{ medium = 1.0 }}
caption_dropout = 0.0
[stages.schedule]
warmup_steps = 0
[stages.settings]
beta = 200.0
"""
    )
    return path


def _train(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([KREA2, "train", "--config", str(config)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, data) -> Path:
    root = tmp_path_factory.mktemp("style-po")
    result = _train(_toml(root, data))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "run"


def test_stpo_trains_the_style_module_alone_from_the_style_stage(run):
    rows = [r for r in read_metrics(run / "metrics.jsonl")
            if r["kind"] == "train" and r["stage"] == "style-po"]  # fmt: skip
    assert [r["step"] for r in rows] == list(range(PO_STEPS))
    # the policy starts as its reference (the style stage's module on the same base)
    assert rows[0]["loss"] == pytest.approx(math.log(2), rel=1e-5)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert rows[0]["grad_norm"] > 0  # the references reach the trained module
    assert rows[-1]["margin"] > 0  # the winners gain on the losers
    before = load_file(stage_style_path(run, "style"))
    after = load_file(stage_style_path(run, "style-po"))
    assert before.keys() == after.keys()
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)
    # only the module trains: the stage's checkpoint holds nothing of the DiT
    (ckpt,) = (run / "checkpoints" / "style-po").glob("step-*")
    keys = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert {k.split(".")[1] for k in keys if k.startswith("model.")} == {"style"}


def test_the_module_it_writes_samples_with_a_reference(run, tmp_path):
    out = tmp_path / "samples"
    ref = tmp_path / "ref.png"
    Image.fromarray(np.full((32, 32, 3), (120, 20, 30), np.uint8)).save(ref)
    result = subprocess.run(
        [KREA2, "train", "sample", str(run), "--stage", "style-po", "--prompt", "a red square",
         "--steps", "2", "--style-ref", f"{ref}:0.5", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (out / "grid.png").is_file()


def test_mismatched_style_and_pairs_are_refused_with_the_fix(tmp_path, data, run):
    job = load_job(_toml(tmp_path / "a", data, style_from="pretrain"))
    with pytest.raises(UserError, match="style_from='pretrain' names a stage that trains no"):
        validate_job(job, 1)
    job = load_job(_toml(tmp_path / "b", data, style_from="later"))
    with pytest.raises(UserError, match="style_from='later' is not an earlier stage"):
        validate_job(job, 1)
    # pairs without references cannot train a style module: the run says so and stops
    root = tmp_path / "c"
    config = _toml(root, data, po_data="plain")
    result = _train(config)
    assert result.returncode != 0
    assert "needs pairs with a reference column" in result.stdout + result.stderr
