"""Run ``krea2`` sub-commands as worker processes, the way an operator would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from krea2.infra import UserError

KREA2 = (sys.executable, "-c", "from krea2.infra.host import main; main()")


def krea2(*args: str, log: Path | None = None) -> str:
    """Run ``krea2 ARGS`` to completion; its output is appended to ``log`` if given."""
    return parallel([list(args)], log)[0]


def parallel(commands: Sequence[Sequence[str]], log: Path | None = None) -> list[str]:
    """Run several ``krea2`` commands at once (e.g. N workers of one job) and wait for all.

    Raises UserError naming the first command that failed, with the tail of its output.
    """
    procs = [
        subprocess.Popen(
            [*KREA2, *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for cmd in commands
    ]
    outputs = [p.communicate()[0] for p in procs]
    if log is not None:
        with log.open("a") as f:
            for cmd, out in zip(commands, outputs, strict=True):
                f.write(f"$ krea2 {' '.join(cmd)}\n{out}\n")
    for cmd, proc, out in zip(commands, procs, outputs, strict=True):
        if proc.returncode != 0:
            raise UserError(f"`krea2 {' '.join(cmd)}` exited {proc.returncode}:\n{out[-3000:]}")
    return outputs
