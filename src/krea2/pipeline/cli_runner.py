"""Run ``krea2`` sub-commands as worker processes, the way an operator would."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from krea2.infra import UserError

KREA2 = (sys.executable, "-c", "from krea2.infra.host import main; main()")
# How long interrupted workers get to release their claims before they are killed (s).
STOP_GRACE_S = 30.0


def krea2(*args: str, log: Path | None = None) -> str:
    """Run ``krea2 ARGS`` to completion; its output is appended to ``log`` if given."""
    return parallel([list(args)], log)[0]


def parallel(
    commands: Sequence[Sequence[str]],
    log: Path | None = None,
    *,
    poll: Callable[[], None] | None = None,
    poll_every_s: float = 1.0,
) -> list[str]:
    """Run several ``krea2`` commands at once (e.g. N workers of one job) and wait for all.

    ``poll`` is called every ``poll_every_s`` seconds while they run (to show progress).
    On Ctrl-C the workers are stopped too (SIGINT, then SIGKILL after ``STOP_GRACE_S``)
    and ``KeyboardInterrupt`` propagates, so none is left running behind the caller.
    Raises UserError naming the first command that failed, with the tail of its output.
    """
    procs = [
        subprocess.Popen(
            [*KREA2, *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for cmd in commands
    ]
    outputs = [""] * len(procs)

    def read(i: int) -> None:
        outputs[i] = procs[i].communicate()[0]

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for t in readers:
        t.start()
    try:
        while alive := [t for t in readers if t.is_alive()]:
            alive[0].join(poll_every_s)
            if poll is not None:
                poll()
    except KeyboardInterrupt:
        _stop(procs)
        raise
    if log is not None:
        with log.open("a") as f:
            for cmd, out in zip(commands, outputs, strict=True):
                f.write(f"$ krea2 {' '.join(cmd)}\n{out}\n")
    for cmd, proc, out in zip(commands, procs, outputs, strict=True):
        if proc.returncode != 0:
            raise UserError(f"`krea2 {' '.join(cmd)}` exited {proc.returncode}:\n{out[-3000:]}")
    return outputs


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    """Interrupt still-running workers (a terminal's Ctrl-C may already have reached
    them), give them ``STOP_GRACE_S`` to hand back their claims, then kill them."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
