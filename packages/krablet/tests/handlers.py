"""Job handlers that the worker subprocess tests load by file path."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

HANDLERS = str(Path(__file__))


def nums_table():  # imported lazily: workers load this file by path, before any krablet import
    """The ``nums`` table the worker tests share: key ``n``, job ``square`` -> ``result``."""
    from krea2.krablet import Job, Table

    return Table(
        "nums",
        key="n",
        key_type="bigint",
        columns={"result": "bigint"},
        jobs=[Job("square", result="result", handler=f"{HANDLERS}:square")],
    )


_calls = itertools.count(1)  # this process's handler calls (next() is atomic under the GIL)


def square(rows: list[dict]) -> list[dict]:
    gate = os.environ.get("KRABLET_TEST_GATE")
    if gate and next(_calls) > int(os.environ.get("KRABLET_TEST_GATE_AFTER", "0")):
        _wait_for(Path(gate))  # a test holds the batch here until it creates the file
    delay = float(os.environ.get("KRABLET_TEST_DELAY", "0"))
    if delay:
        time.sleep(delay)
    return [{"result": r["n"] * r["n"]} for r in rows]


def _wait_for(gate: Path) -> None:
    """Announce the first wait in ``KRABLET_TEST_NOTICE`` (as ``krea2.infra.pause`` does, so
    ``wait_for_pause`` reads it), then block until ``gate`` exists."""
    notice = os.environ.get("KRABLET_TEST_NOTICE")
    if notice and not gate.exists() and not os.path.exists(notice):
        with open(notice, "a", encoding="utf-8") as f:
            f.write(f"paused at square (pid {os.getpid()})\n")
    while not gate.exists():
        time.sleep(0.01)


def fail_all(rows: list[dict]) -> list[Exception]:
    """Every row fails (a handler that cannot do this job at all)."""
    return [ValueError(f"cannot square {r['n']}") for r in rows]
