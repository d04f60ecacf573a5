"""`krea2 train` as a real process: Ctrl-C mid-stage, a corrupt newest checkpoint on
--resume, and the progress lines a log gets."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from krea2.infra.checkpoint_layout import scan_checkpoints
from krea2.infra.pause import pause_env, wait_for_pause
from krea2.trainer.observe import read_metrics

KREA2 = str(Path(sys.executable).parent / "krea2")
STEPS = 60
HELD_AT = 7  # steps done when Ctrl-C lands: after step 5's async save began (every = 3)


def krea2_train(config: Path, *args: str, pause: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "KREA2_PROGRESS": "plain", **(pause or {})}
    return subprocess.Popen(
        [KREA2, "train", "--config", str(config), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, shards) -> Path:
    """A run SIGINTed (as Ctrl-C does) while held after step 6, with step 5's async
    checkpoint begun and perhaps still in flight; returns its root (job.toml, run/, and the
    process's output in output.txt and rc in rc.txt).

    The loop is held at a pause point (``train pretrain`` at HELD_AT steps done; it updates
    its progress before it saves a step, so step 6 saves nothing) until the SIGINT arrives,
    so the Ctrl-C lands in that state on any machine, never after the run went on."""
    from trainer_test_helpers import job_toml

    root = tmp_path_factory.mktemp("interrupted")
    (root / "job.toml").write_text(job_toml(root / "run", shards, steps=STEPS))
    notice = root / "paused"
    proc = krea2_train(root / "job.toml", pause=pause_env("train pretrain", HELD_AT, notice))
    out = signal_when_held(proc, notice, signal.SIGINT)
    (root / "output.txt").write_text(out)
    (root / "rc.txt").write_text(str(proc.returncode))
    return root


def signal_when_held(proc: subprocess.Popen, notice: Path, sig: signal.Signals) -> str:
    """Send ``sig`` once ``proc`` announces its pause in ``notice``; its whole output."""
    try:
        wait_for_pause(notice, proc, timeout_s=300)
        proc.send_signal(sig)
        return finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()  # only after a failure above: the test has no use for the run


def copy_run(interrupted: Path, tmp_path: Path) -> Path:
    """A private copy of the interrupted run; returns its job file (run_dir rewritten)."""
    shutil.copytree(interrupted / "run", tmp_path / "run")
    job = tmp_path / "job.toml"
    text = (interrupted / "job.toml").read_text()
    job.write_text(text.replace(str(interrupted / "run"), str(tmp_path / "run")))
    return job


def test_ctrl_c_exits_130_without_marking_the_stage_or_tearing_a_checkpoint(interrupted):
    output = (interrupted / "output.txt").read_text()
    assert (interrupted / "rc.txt").read_text() == "130", output
    assert "interrupted" in output.splitlines()[-1]
    root = interrupted / "run" / "checkpoints"
    assert not (root / "pretrain.done").exists()
    entries = scan_checkpoints(root / "pretrain")
    assert entries and all(e.complete for e in entries), entries
    newest = entries[-1].step
    assert newest == HELD_AT - 2 < STEPS - 1  # the save in flight finished; none began after
    assert f"krea2 train --resume continues it from step {newest + 1}" in output
    assert "train pretrain:" in output and "(stopped)" in output  # the last progress line


def test_resume_after_ctrl_c_continues_from_the_newest_checkpoint(interrupted, tmp_path):
    job = copy_run(interrupted, tmp_path)
    newest = scan_checkpoints(tmp_path / "run" / "checkpoints" / "pretrain")[-1].step
    proc = krea2_train(job, "--resume")
    out = finish(proc)
    assert proc.returncode == 0, out
    assert f"resumed stage pretrain at step {newest + 1}" in out
    assert f"train pretrain: {STEPS}/{STEPS} step (100%)" in out
    assert (tmp_path / "run" / "checkpoints" / "pretrain.done").exists()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(STEPS))


def test_resume_past_a_corrupt_newest_checkpoint_says_so_and_keeps_it(interrupted, tmp_path):
    job = copy_run(interrupted, tmp_path)
    ckpts = tmp_path / "run" / "checkpoints" / "pretrain"
    *_, older, newest = scan_checkpoints(ckpts)
    shard = max(newest.path.glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    started = time.time()
    proc = krea2_train(job, "--resume")
    out = finish(proc)
    assert proc.returncode == 0, out
    warning = next(line for line in out.splitlines() if "CORRUPT CHECKPOINT" in line)
    assert "WARNING" in warning and shard.name in warning and "truncated" in warning
    assert f"resuming from step {older.step} instead" in warning
    assert f"resumed stage pretrain at step {older.step + 1}" in out
    (kept,) = ckpts.glob(f"corrupt-{newest.path.name}-*")
    assert kept.name in warning and (kept / shard.name).stat().st_mtime < started
    assert "truncated" in (kept / "CORRUPT_REASON.txt").read_text()
    # The resumed run saved that step again beside the kept one.
    assert all(e.complete for e in scan_checkpoints(ckpts))


@pytest.mark.parametrize("entry", ["krea2 train", "python -m krea2.trainer"])
def test_sigterm_stops_it_as_ctrl_c_does_and_exits_143(tmp_path, shards, entry):
    # what Kubernetes, Slurm and torchrun send: the checkpoint in flight is finished, the
    # log says where --resume continues, no traceback, and the status says SIGTERM. The
    # `krea2 train` run has 2 decode workers, which SIGTERM once left running and leaking
    # semaphores ("14 leaked semaphore objects"): they must end with it, quietly.
    from trainer_test_helpers import job_toml, single

    text = job_toml(tmp_path / "run", shards, steps=STEPS)
    if entry == "krea2 train":
        text = text.replace("workers = 0", "workers = 2")
    (tmp_path / "job.toml").write_text(text)
    notice = tmp_path / "paused"
    pause = pause_env("train pretrain", HELD_AT, notice)
    if entry == "krea2 train":
        proc = krea2_train(tmp_path / "job.toml", pause=pause)
    else:
        proc = single(tmp_path / "job.toml", env={"KREA2_PROGRESS": "plain", **pause})
    out = signal_when_held(proc, notice, signal.SIGTERM)
    assert proc.returncode == 143, out
    assert out.strip().splitlines()[-1].endswith("terminated") and "Traceback" not in out, out
    assert "leaked semaphore" not in out, out
    entries = scan_checkpoints(tmp_path / "run" / "checkpoints" / "pretrain")
    assert entries and all(e.complete for e in entries) and entries[-1].step == HELD_AT - 2
    assert f"krea2 train --resume continues it from step {HELD_AT - 1}" in out
    assert not (tmp_path / "run" / "checkpoints" / "pretrain.done").exists()


def test_ctrl_c_in_a_terminal_stops_the_decode_workers_quietly(tmp_path, shards):
    # a terminal sends SIGINT to the whole foreground process group, decode workers included:
    # they must leave the stop to the trainer (no worker traceback, no leaked semaphores)
    from trainer_test_helpers import job_toml

    text = job_toml(tmp_path / "run", shards, steps=STEPS).replace("workers = 0", "workers = 2")
    (tmp_path / "job.toml").write_text(text)
    notice = tmp_path / "paused"
    env = {**os.environ, "KREA2_PROGRESS": "plain", **pause_env("train pretrain", 3, notice)}
    proc = subprocess.Popen(
        [KREA2, "train", "--config", str(tmp_path / "job.toml")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_pause(notice, proc, timeout_s=300)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal does
        out = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out
    assert out.strip().splitlines()[-1] == "interrupted", out
    assert "Traceback" not in out and "leaked semaphore" not in out, out
