"""Checkpoint manager: atomic sync/async saves, retention, discovery, corruption, 2 ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from krea2.infra.checkpoint import (
    CheckpointCorruptError,
    CheckpointManager,
    CheckpointMismatchError,
    capture_rng_state,
    restore_rng_state,
)
from krea2.infra.checkpoint_layout import scan_checkpoints, steps_to_delete

HERE = Path(__file__).parent


def make_state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)},
        "optimizer": {"exp_avg": torch.randn(64, 32, generator=g), "step": torch.tensor(seed)},
    }


def zeros_like(state: dict) -> dict:
    return {
        k: zeros_like(v) if isinstance(v, dict) else torch.zeros_like(v) for k, v in state.items()
    }


def assert_equal_states(a: dict, b: dict) -> None:
    for key in a:
        if isinstance(a[key], dict):
            assert_equal_states(a[key], b[key])
        else:
            assert torch.equal(a[key], b[key]), key


def test_sync_save_then_load_restores_tensors_and_plain_data(tmp_path):
    manager = CheckpointManager(tmp_path)
    state = make_state(1)
    path = manager.save(10, state, {"step": 10, "data_position": [3, 7]})
    assert path.name == "step-000000010" and (path / "COMPLETE").is_file()
    restored = zeros_like(state)
    assert manager.load(restored) == {"step": 10, "data_position": [3, 7]}
    assert_equal_states(state, restored)


def test_async_save_snapshots_state_at_call_time(tmp_path):
    manager = CheckpointManager(tmp_path)
    state = make_state(2)
    expected = {k: {n: t.clone() for n, t in v.items()} for k, v in state.items()}
    pending = manager.async_save(5, state, {"step": 5})
    state["model"]["w"].add_(1.0)  # the training loop moves on immediately
    assert pending.wait().name == "step-000000005"
    restored = zeros_like(state)
    manager.load(restored)
    assert_equal_states(expected, restored)


def test_async_saves_reuse_staging_buffers_and_stay_isolated(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=10)
    state = make_state(3)
    snapshots = {}
    for step in (1, 2, 3):
        state["model"]["w"].add_(step)
        snapshots[step] = state["model"]["w"].clone()
        manager.async_save(step, state)
    manager.wait()
    for step in (1, 2, 3):
        restored = zeros_like(state)
        manager.load(restored, step=step)
        assert torch.equal(restored["model"]["w"], snapshots[step])


def test_failed_async_write_surfaces_in_wait_and_publishes_nothing(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import CheckpointException, FileSystemWriter

    manager = CheckpointManager(tmp_path)
    state = make_state(5)
    manager.save(1, state, {"step": 1})

    def disk_full(self, plan, planner):
        raise OSError("disk full")

    monkeypatch.setattr(FileSystemWriter, "write_data", disk_full)
    manager.async_save(2, state, {"step": 2})
    with pytest.raises((OSError, CheckpointException), match="disk full"):
        manager.wait()
    monkeypatch.undo()
    assert manager.complete_steps() == [1]
    restored = zeros_like(state)
    assert manager.load(restored) == {"step": 1}
    assert_equal_states(state, restored)


def test_checkpoint_code_uses_only_public_torch_modules():
    import ast

    import krea2.infra.checkpoint as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    private = [m for m in imported if m.startswith("torch") and "._" in m]
    assert not private, private


def test_retention_keeps_last_n_and_every_kth(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, keep_every=10)
    state = make_state(4)
    for step in (5, 10, 15, 20, 25, 30, 35):
        manager.save(step, state)
    assert manager.complete_steps() == [10, 20, 30, 35]
    assert steps_to_delete([1, 2, 3], keep_last=1, keep_every=None) == [1, 2]


def test_latest_step_is_none_without_checkpoints_and_load_says_where(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt")
    assert manager.latest_step() is None
    with pytest.raises(FileNotFoundError, match="ckpt"):
        manager.load(make_state(0))


def truncate_largest_shard(path: Path) -> Path:
    shard = max(
        (p for p in path.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size
    )
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    return shard


def test_truncated_shard_is_named_and_load_falls_back_to_previous(tmp_path):
    manager = CheckpointManager(tmp_path)
    older, newer = make_state(1), make_state(2)
    manager.save(1, older, {"step": 1})
    bad = manager.save(2, newer, {"step": 2})
    shard = truncate_largest_shard(bad)
    with pytest.raises(CheckpointCorruptError) as err:
        manager.load(zeros_like(newer), step=2)
    assert str(bad) in str(err.value) and shard.name in str(err.value)
    seen: list[CheckpointCorruptError] = []
    restored = zeros_like(older)
    assert manager.load(restored, on_fallback=seen.append) == {"step": 1}
    assert_equal_states(older, restored)
    assert [e.path for e in seen] == [bad]
    assert manager.latest_step() == 1


def test_corrupt_newest_is_warned_about_and_kept_aside_not_replaced(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    older = make_state(1)
    manager.save(1, older, {"step": 1})
    bad = manager.save(2, make_state(2), {"step": 2})
    shard = truncate_largest_shard(bad)
    with caplog.at_level("WARNING", logger="krea2.infra.checkpoint"):
        assert manager.load(zeros_like(older)) == {"step": 1}
    warning = next(r for r in caplog.records if r.levelname == "WARNING").getMessage()
    assert "CORRUPT CHECKPOINT" in warning and shard.name in warning
    assert "resuming from step 1 instead" in warning
    (kept,) = tmp_path.glob("corrupt-step-000000002-*")
    assert kept.name in warning and shard.name in (kept / "CORRUPT_REASON.txt").read_text()
    assert not bad.exists()
    assert [e.step for e in scan_checkpoints(tmp_path)] == [1]  # scans ignore it
    manager.save(2, make_state(3))  # the resumed run saves step 2 again
    assert kept.is_dir() and (kept / shard.name).is_file()  # and the evidence stays


def test_explicit_step_load_of_a_corrupt_checkpoint_moves_nothing(tmp_path):
    manager = CheckpointManager(tmp_path)
    bad = manager.save(1, make_state(1))
    truncate_largest_shard(bad)
    with pytest.raises(CheckpointCorruptError):
        manager.load(make_state(0), step=1)
    assert bad.is_dir() and not list(tmp_path.glob("corrupt-*"))


def test_a_checkpoint_of_another_model_config_is_named_and_never_set_aside(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, make_state(1), {"step": 1})
    newest = manager.save(2, make_state(2), {"step": 2})
    other = zeros_like(make_state(0))
    other["model"]["w"] = torch.zeros(64, 8)  # e.g. another patch size: another input width
    other["optimizer"]["exp_avg"] = torch.zeros(64, 8)
    with pytest.raises(CheckpointMismatchError, match=r"model\.w is \[64, 32\] there, \[64, 8\]"):
        manager.load(other)
    assert newest.is_dir() and not list(tmp_path.glob("corrupt-*"))  # nothing moved
    assert manager.latest_step() == 2
    assert torch.count_nonzero(other["model"]["b"]) == 0  # nothing was read into the state
    with pytest.raises(CheckpointMismatchError, match=r"optimizer\.exp_avg"):
        manager.load(other, step=1)


def test_garbage_in_a_shard_with_the_right_size_is_a_clear_error(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(1, make_state(1))
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(b"\0" * shard.stat().st_size)
    with pytest.raises(CheckpointCorruptError, match=str(path)):
        manager.load(make_state(0), step=1)


@pytest.mark.parametrize("stop_at", ["manifest", "marker", "write"])
def test_sigkill_mid_save_leaves_previous_checkpoint_loadable(tmp_path, stop_at):
    child = subprocess.Popen(
        [sys.executable, str(HERE / "ckpt_child.py"), str(tmp_path), stop_at],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in child.stdout:
            if line.strip() == "STOPPED":  # it holds there until killed (ckpt_child.hang)
                break
        else:
            raise AssertionError("the child ended before its stop point")
        if stop_at == "write":  # tensor bytes are actually being written
            tmp = tmp_path / ".tmp-step-000000002"
            assert any(p.stat().st_size > 0 for p in tmp.iterdir())
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()  # already dead unless the test failed before its SIGKILL
        child.wait(timeout=60)
    manager = CheckpointManager(tmp_path)
    assert manager.latest_step() == 1
    sys.path.insert(0, str(HERE))
    from ckpt_child import state_for

    expected = state_for(1)
    restored = zeros_like(expected)
    assert manager.load(restored) == {"step": 1}
    assert_equal_states(expected, restored)
    # The next save cleans the torn attempt up and succeeds.
    manager.save(2, expected)
    assert manager.complete_steps() == [1, 2]
    assert not list(tmp_path.glob(".tmp-*"))
    assert all(e.complete for e in scan_checkpoints(tmp_path))


def test_rng_state_round_trips_through_json_data(tmp_path):
    import random

    import numpy as np

    state = capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"x": torch.zeros(1)}, {"rng": state})
    random.random(), np.random.rand(), torch.rand(1)
    restore_rng_state(manager.load({"x": torch.zeros(1)})["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


@pytest.mark.distributed
def test_two_ranks_save_sharded_dtensors_and_reload_on_one(tmp_path):
    import torch.multiprocessing as mp

    sys.path.insert(0, str(HERE))
    import ckpt_child

    mp.spawn(ckpt_child.two_rank_worker, args=(str(tmp_path),), nprocs=2, join=True)
    # Resharding: one process loads the full tensor that two ranks saved in halves.
    full = {"model": {"w": torch.zeros(8, 4)}, "bias": torch.zeros(3)}
    extra = CheckpointManager(tmp_path / "ckpt").load(full)
    assert torch.equal(full["model"]["w"], torch.arange(32.0).reshape(8, 4))
    assert extra == {"rank": 0, "data_position": 0}


def test_infra_checkpoints_command_lists_complete_and_torn(tmp_path):
    from typer.testing import CliRunner

    from krea2.infra.cli import app

    manager = CheckpointManager(tmp_path)
    manager.save(1, make_state(1))
    truncate_largest_shard(manager.save(2, make_state(2)))
    result = CliRunner().invoke(app, ["checkpoints", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "step          1" in lines[0] and "complete" in lines[0]
    assert "step          2" in lines[1] and "INCOMPLETE" in lines[1] and "truncated" in lines[1]
    empty = CliRunner().invoke(app, ["checkpoints", str(tmp_path / "none")])
    assert empty.exit_code == 1 and "no checkpoints" in empty.output


def test_infra_checkpoints_command_finds_each_stage_of_a_run_directory(tmp_path):
    run = tmp_path / "runs" / "toy"
    for stage, steps in (("p32", (1, 2)), ("p64", (3,))):
        manager = CheckpointManager(run / "checkpoints" / stage)
        for step in steps:
            manager.save(step, make_state(step))
    truncate_largest_shard(run / "checkpoints" / "p32" / "step-000000002")
    CheckpointManager(run / "checkpoints" / "p32").load(make_state(0))  # sets step 2 aside
    krea2 = str(Path(sys.executable).parent / "krea2")
    for arg in (run, run / "checkpoints"):
        result = subprocess.run(
            [krea2, "infra", "checkpoints", str(arg)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == f"{run / 'checkpoints' / 'p32'}:"
        assert "step          1" in lines[1] and "complete" in lines[1]
        assert lines[2].startswith("set aside as corrupt: ") and "truncated" in lines[2]
        assert lines[3] == f"{run / 'checkpoints' / 'p64'}:"
        assert "step          3" in lines[4]
    empty = subprocess.run(
        [krea2, "infra", "checkpoints", str(tmp_path / "none")], capture_output=True, text=True
    )
    assert empty.returncode == 1 and "no checkpoints under" in empty.stdout
