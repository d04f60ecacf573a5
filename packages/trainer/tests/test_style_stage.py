"""The ``style`` objective on the trainer's loop: flow matching → a style-reference module
on the frozen base, run by ``krea2 train --config``. Only the module trains (the base's
weights are the stage's start), checkpoints hold only it, the finished stage writes
``style.safetensors``; 2 gloo ranks equal 1 rank; a SIGKILL mid-stage resumes to the same
losses; paired references come from the shards' ``reference`` column."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from krea2.infra.errors import UserError
from krea2.infra.shards import write_shard
from krea2.trainer import load_job, read_metrics, stage_style_path, validate_job
from krea2.trainer.held_run import held_env, kill_when_held, newest_save_at
from krea2.trainer.testing import tiny_job_head, toy_rows

KREA2 = str(Path(sys.executable).parent / "krea2")
LAUNCH = str(Path(__file__).with_name("launch_ranks.py"))
STYLE_STEPS = 4
COMPARED = ("loss", "grad_norm")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """64 toy rows (32 px), each with another row's image as its ``reference``."""
    root = tmp_path_factory.mktemp("style-data")
    rows = toy_rows(64, 32, 32, seed=0)
    for i, row in enumerate(rows):
        row["reference"] = rows[(i + 7) % len(rows)]["image"]
    write_shard(rows, root / "shard-000.parquet", stage="p32", seed=0, batch_size=8)
    return root


def _job(root: Path, data: Path, settings: str = 'reference = "inpaint_shuffle"') -> Path:
    path = root / "job.toml"
    path.write_text(
        tiny_job_head(root / "run", every=1)
        + f"""[[stages]]
name = "pretrain"
data = ["{data}/*.parquet"]
init_from = "none"
steps = 2
batch_size = 8
lr = 1e-3
[[stages]]
name = "style"
objective = "style"
data = ["{data}/*.parquet"]
steps = {STYLE_STEPS}
batch_size = 8
lr = 1e-3
[stages.schedule]
warmup_steps = 0
[stages.settings]
{settings}
"""
    )
    return path


def _train(config: Path, *args: str, nproc: int = 1, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, LAUNCH, str(nproc), "--config", str(config), *args]
    if nproc == 1 and not args:
        cmd = [KREA2, "train", "--config", str(config)]  # the console command a user types
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full, start_new_session=True)  # fmt: skip


def _rows(run: Path) -> dict[tuple[str, int], dict]:
    return {(r["stage"], r["step"]): r for r in read_metrics(run / "metrics.jsonl")
            if r["kind"] == "train"}  # fmt: skip


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, data) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("style-1")
    out, _ = (proc := _train(_job(root, data))).communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    return root, _rows(root / "run")


def test_only_the_module_trains_and_the_stage_writes_it(one_rank):
    from torch.distributed.checkpoint import FileSystemReader

    from krea2.dit import load_style_module

    root, rows = one_rank
    assert sorted({s for s, _ in rows}) == ["pretrain", "style"]
    for step in range(STYLE_STEPS):
        row = rows[("style", step)]
        assert math.isfinite(row["loss"]) and row["grad_norm"] > 0, row
        assert row["reference_strength"] == pytest.approx(1.0)
    # a style checkpoint holds the module, not the frozen 12B-to-be base
    ckpt = root / "run" / "checkpoints" / "style"
    newest = sorted(p for p in ckpt.iterdir() if p.name.startswith("step-"))[-1]
    keys = FileSystemReader(newest).read_metadata().state_dict_metadata
    model = [k for k in keys if k.startswith("model.")]
    assert model and all(k.startswith("model.style.") for k in model), model[:5]
    job = load_job(root / "job.toml")
    module = load_style_module(stage_style_path(root / "run", "style"))
    assert module.cfg.tokens == 4 and module.cfg.width == 64
    assert job.stages[1].objective == "style"


def test_two_gloo_ranks_equal_one(tmp_path, data, one_rank):
    _, one = one_rank
    out, _ = (proc := _train(_job(tmp_path, data), nproc=2)).communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    two = _rows(tmp_path / "run")
    assert sorted(two) == sorted(one)
    for key, a in one.items():
        for name in COMPARED:
            assert two[key][name] == pytest.approx(a[name], rel=1e-4, abs=1e-7), (key, name)


def test_the_spatial_path_trains_on_two_gloo_ranks_as_on_one(tmp_path, data):
    """pool = "tiles" and cross: the DiT calls the module's StyleCross layers after the
    module's forward, so under FSDP2 each is its own unit (gathered when called)."""
    from krea2.dit import load_style_module

    settings = 'reference = "inpaint_shuffle"\npool = "tiles"\ncross = 2'
    runs = []
    for nproc in (1, 2):
        root = tmp_path / f"ranks-{nproc}"
        root.mkdir()
        out, _ = (proc := _train(_job(root, data, settings), nproc=nproc)).communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        runs.append(_rows(root / "run"))
    for key, a in runs[0].items():
        for name in COMPARED:
            assert runs[1][key][name] == pytest.approx(a[name], rel=1e-4, abs=1e-7), (key, name)
    module = load_style_module(stage_style_path(tmp_path / "ranks-2" / "run", "style"))
    assert (module.cfg.pool, module.cfg.cross) == ("tiles", 2)
    assert any(float(layer.wo.weight.detach().abs().sum()) > 0 for layer in module.cross)


def test_sigkill_mid_stage_resumes_to_the_same_losses(tmp_path, data, one_rank):
    _, one = one_rank
    config = _job(tmp_path, data)
    notice, saved = tmp_path / "paused", newest_save_at(3, every=1)
    proc = _train(config, nproc=1, env=held_env("style", 3, notice))
    kill_when_held(proc, notice, tmp_path / "run" / "checkpoints" / "style", saved)
    out, _ = (proc := _train(config, "--resume")).communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert f"resumed stage style at step {saved + 1}" in out
    rows = _rows(tmp_path / "run")
    for key, a in one.items():
        for name in COMPARED:
            assert rows[key][name] == pytest.approx(a[name], rel=1e-5, abs=1e-9), (key, name)


def test_paired_references_come_from_the_reference_column(tmp_path, data):
    out, _ = (proc := _train(_job(tmp_path, data, 'reference = "paired"'))).communicate(600)
    assert proc.returncode == 0, out[-3000:]
    assert math.isfinite(_rows(tmp_path / "run")[("style", STYLE_STEPS - 1)]["loss"])


def test_settings_are_checked_with_their_key(tmp_path, data):
    def problem(settings: str) -> str:
        with pytest.raises(UserError) as err:
            validate_job(load_job(_job(tmp_path, data, settings)), 1)
        return str(err.value)

    assert "stages.1.settings.refrence" in problem('refrence = "shuffle"')
    assert "strength" in problem("strength = [0.0, 1.0]")
    assert "'copy'" in problem('reference = "copy"')
    assert "pool = 'grid'" in problem('pool = "grid"')
    assert "cross = -1" in problem("cross = -1")


def test_a_cross_past_the_dits_blocks_is_refused_when_the_module_is_built():
    from krea2.dit import get_config
    from krea2.trainer.style_settings import StyleSettings, build_style_module

    tiny = get_config("tiny")  # 2 blocks
    assert len(build_style_module(StyleSettings(pool="tiles", cross=2), tiny, 0).cross) == 2
    with pytest.raises(UserError, match="cross 3 but the DiT 'tiny' has only 2 blocks"):
        build_style_module(StyleSettings(pool="tiles", cross=3), tiny, 0)


def test_reference_transforms_keep_style_and_destroy_layout():
    from krea2.trainer import ReferenceMode, style_references

    side = 32
    ramp = torch.linspace(20, 60, side)
    image = torch.stack([ramp[:, None].expand(side, side)] * 3).round().to(torch.uint8)
    image[:, 4:14, 18:28] = torch.tensor([240, 215, 40], dtype=torch.uint8)[:, None, None]
    batch = image[None]

    def gens():
        return [torch.Generator().manual_seed(3)]

    shuffled = style_references(batch, ReferenceMode.SHUFFLE, gens(), tiles=4)
    assert torch.equal(shuffled, style_references(batch, ReferenceMode.SHUFFLE, gens(), 4))
    assert not torch.equal(shuffled, batch)
    assert torch.equal(shuffled.flatten(1).sort(1).values, batch.flatten(1).sort(1).values)
    cleaned = style_references(batch, ReferenceMode.INPAINT_SHUFFLE, gens(), tiles=4)
    yellow = (cleaned[0, 0] > 200) & (cleaned[0, 2] < 100)
    assert int(yellow.sum()) == 0  # the object is painted over ...
    assert int(cleaned.max()) <= 62 and int(cleaned.min()) >= 18  # ... with the background
    copy = style_references(batch, ReferenceMode.RECONSTRUCT, gens())
    assert copy.shape == batch.shape and int(((copy[0, 0] > 200) & (copy[0, 2] < 100)).sum()) > 50
    with pytest.raises(UserError, match="reference"):
        style_references(batch, ReferenceMode.PAIRED, gens())
    with pytest.raises(UserError, match="tiles"):
        style_references(batch, ReferenceMode.SHUFFLE, gens(), tiles=5)


def test_train_sample_takes_style_references_and_refuses_bad_ones(tmp_path, one_rank):
    from PIL import Image

    root, _ = one_rank
    ref = tmp_path / "ref.png"
    Image.new("RGB", (40, 48), (120, 30, 60)).save(ref)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")

    def sample(*args: str) -> subprocess.CompletedProcess:
        cmd = [KREA2, "train", "sample", str(root / "run"), "--prompt", "blob 1 in cell 4",
               "--steps", "2", "--cfg", "0", "--out", str(tmp_path / "out"), *args]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)

    done = sample("--stage", "style", "--style-ref", f"{ref}:0.5", "--style-ref", str(ref))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "grid.png").exists()
    styled = (tmp_path / "out" / "p00-s0.png").read_bytes()
    zero = sample("--stage", "style", "--style-ref", f"{ref}:0")
    plain = sample("--stage", "style")
    assert zero.returncode == plain.returncode == 0
    unstyled = (tmp_path / "out" / "p00-s0.png").read_bytes()
    # timed out of every Euler step (t = 0 is none): the exact path without references
    never = sample("--stage", "style", "--style-ref", str(ref), "--style-times", "0:0")
    assert never.returncode == 0, never.stderr[-2000:]
    assert (tmp_path / "out" / "p00-s0.png").read_bytes() == unstyled != styled
    for problem, args in [
        ("needs a style stage", ("--stage", "pretrain", "--style-ref", str(ref))),
        ("bad.png", ("--stage", "style", "--style-ref", str(bad))),
        ("strength", ("--stage", "style", "--style-ref", f"{ref}:-1")),
        ("LO:HI", ("--stage", "style", "--style-ref", str(ref), "--style-times", "late")),
        ("needs a --style-ref", ("--stage", "style", "--style-times", "0:1")),
    ]:
        failed = sample(*args)
        assert failed.returncode != 0 and problem in failed.stderr, failed.stderr[-2000:]
        assert "Traceback" not in failed.stderr
