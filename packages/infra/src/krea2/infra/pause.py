"""Pause points: hold a program at a named point of its work until a signal ends it.

Tests that stop a program "in stage X" need the stop to land while X is provably under way
and cannot finish first. A timer ("X takes ~3 s, signal after 1") breaks on a faster
machine; a progress line alone races the rest of the loop. A pause point makes the moment
an event: with ``KREA2_PAUSE_AT=LABEL:COUNT`` set, the first time the process reaches
``LABEL`` with at least ``COUNT`` units done it announces itself and sleeps, so the stage
stays exactly there until the test's SIGINT (a ``KeyboardInterrupt``, handled as a real
Ctrl-C) or SIGKILL arrives.

Every :class:`krea2.infra.progress.Progress` is a pause point named by its description
(``train pretrain-32:3`` holds training after its third step's progress update); other
code calls :func:`pause_point` directly. The announcement, ``paused at LABEL N (pid P)``,
goes to stderr and, with ``KREA2_PAUSE_NOTICE=PATH``, is appended to that file, which is how
a test learns of a pause inside a subprocess whose output it does not see. Unset (the
normal case) a pause point costs one dictionary lookup. ``KREA2_PAUSE_S`` (default 300)
bounds the wait, after which the program goes on, so a forgotten setting cannot hang it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["PAUSE_ENV", "pause_env", "pause_point", "pause_target", "wait_for_pause"]

PAUSE_ENV = "KREA2_PAUSE_AT"
NOTICE_ENV = "KREA2_PAUSE_NOTICE"
LIMIT_ENV = "KREA2_PAUSE_S"

_deadlines: dict[str, float] = {}  # label -> when its (one) pause ends, in monotonic seconds
_lock = threading.Lock()


def pause_target() -> tuple[str, int] | None:
    """``(label, count)`` from ``KREA2_PAUSE_AT=LABEL:COUNT`` (``LABEL`` alone: count 0), or
    None when unset. The label may itself hold colons; the count is after the last one."""
    raw = os.environ.get(PAUSE_ENV, "").strip()
    if not raw:
        return None
    label, sep, count = raw.rpartition(":")
    if not sep or not count.strip().isdigit():
        return raw, 0
    return label.strip(), int(count)


def pause_point(label: str, done: int = 0, until: threading.Event | None = None) -> None:
    """Hold here when ``KREA2_PAUSE_AT`` names ``label`` and ``done`` has reached its count
    (module docstring); otherwise return at once. A label pauses once per process: the first
    caller announces it, and every thread that reaches it while the pause lasts holds too (a
    worker's slots all stop mid-batch). ``until``: an event that ends the hold early, for
    code whose signal handlers only ask it to stop (a handled SIGTERM does not interrupt a
    sleep the way Ctrl-C's KeyboardInterrupt does)."""
    target = pause_target()
    if target is None or target[0] != label or done < target[1]:
        return
    with _lock:
        deadline = _deadlines.get(label)
        if deadline is None:
            limit = float(os.environ.get(LIMIT_ENV, "300") or 300)
            deadline = _deadlines[label] = time.monotonic() + limit
            _announce(f"paused at {label} {done} (pid {os.getpid()})")
    while (left := deadline - time.monotonic()) > 0:
        if until is None:
            time.sleep(min(left, 0.5))  # a signal's handler runs between these sleeps
        elif until.wait(min(left, 0.05)):
            with _lock:
                _deadlines[label] = 0.0  # ended for every holder and every later caller
            return


def _announce(notice: str) -> None:
    print(notice, file=sys.stderr, flush=True)
    path = os.environ.get(NOTICE_ENV, "").strip()
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(notice + "\n")


# --------------------------------------------------------------------------- the test's side
def pause_env(label: str, count: int, notice: Path) -> dict[str, str]:
    """Environment entries that make a child process hold at ``label`` once ``count`` units
    are done and announce it in the file ``notice`` (add them to the child's environment)."""
    return {PAUSE_ENV: f"{label}:{count}", NOTICE_ENV: str(notice)}


def wait_for_pause(
    notice: Path, proc: subprocess.Popen | None = None, timeout_s: float = 600.0
) -> str:
    """Block until a pause is announced in ``notice``; returns the announcement. Raises
    RuntimeError when ``proc`` exits first (it never reached the point) or after
    ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if notice.exists() and (text := notice.read_text(encoding="utf-8")).endswith("\n"):
            return text.splitlines()[0]
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process exited ({proc.returncode}) before the pause point")
        time.sleep(0.02)
    raise RuntimeError(f"no pause announced in {notice} within {timeout_s:.0f} s")
