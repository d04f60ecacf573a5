"""Stopping a training job at one exact state, for tests of kills and resumes.

A test that SIGKILLs a run "mid-stage" must know what the run had saved when it died, on
any machine. The trainer's loop is a pause point (:mod:`krea2.infra.pause`) named
``train STAGE``; held there, a rank neither trains nor begins a save, and only the async
save it began last may still be writing. :func:`kill_when_held` waits for that save, then
kills: checkpoints up to :func:`newest_save_at` complete, none after it begun.

Used by the trainer's and rl's tests (both run jobs on the trainer's loop)::

    env = {**os.environ, **held_env("pretrain", 5, notice)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    kill_when_held(proc, notice, run / "checkpoints" / "pretrain", newest_save_at(5, every=2))
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from krea2.infra.checkpoint_layout import TMP_PREFIX, scan_checkpoints
from krea2.infra.pause import pause_env, wait_for_pause

__all__ = ["held_env", "kill_when_held", "newest_save_at"]


def held_env(stage: str, count: int, notice: Path) -> dict[str, str]:
    """Environment entries that hold the trainer's loop of ``stage`` right after its progress
    reaches ``count`` steps done, announced in the file ``notice``."""
    return pause_env(f"train {stage}", count, notice)


def newest_save_at(count: int, every: int) -> int:
    """The newest checkpoint step a run held at ``count`` steps done has begun to save
    (``checkpoint.every = every``). The loop counts step ``s`` done (progress ``s + 1``)
    before it saves it, so every step ``s`` with ``(s + 1) % every == 0`` and
    ``s + 1 < count`` has its save issued (an async save first waits for the one before
    it), and step ``count - 1``'s is not."""
    step = (count - 1) // every * every - 1
    if step < 0:
        raise ValueError(f"no checkpoint is begun by {count} steps with every={every}")
    return step


def kill_when_held(
    proc: subprocess.Popen,
    notice: Path,
    checkpoints: Path,
    step: int,
    nranks: int = 1,
    timeout_s: float = 300,
) -> None:
    """SIGKILL the job ``proc`` (its whole process group: start it with
    ``start_new_session=True``) once all ``nranks`` ranks are held at the pause point
    announced in ``notice`` and checkpoint ``step`` is complete under ``checkpoints``;
    AssertionError if the job ends first, the save never completes, or a later one began."""
    wait_for_pause(notice, proc, timeout_s)
    deadline = time.monotonic() + timeout_s

    def newest() -> int | None:
        done = [e.step for e in scan_checkpoints(checkpoints) if e.complete]
        return done[-1] if done else None

    # Each condition is one the held job can only reach, never pass: no kill races it.
    while len(notice.read_text().splitlines()) < nranks or newest() != step:
        if proc.poll() is not None:
            out = proc.communicate()[0] or ""
            raise AssertionError(f"the job ended while held:\n{out[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"checkpoint {step} never completed (newest: {newest()})")
        time.sleep(0.02)  # a poll of the held job, not a timer: see above
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    if newest() != step or list(checkpoints.glob(f"{TMP_PREFIX}*")):
        raise AssertionError(f"a save after step {step} began before the kill")
