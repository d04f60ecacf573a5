"""Resumable stages: each finished stage leaves a JSON record, so a re-run skips it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console


@dataclass
class StageRecord:
    """What a finished stage produced (JSON-able) and how long it took (seconds)."""

    name: str
    seconds: float
    result: dict[str, Any]
    resumed: bool = False


class StoppedAfter(Exception):
    """Raised by :class:`StageRunner` once the stage it was asked to stop after is done."""

    def __init__(self, stage: str) -> None:
        super().__init__(stage)
        self.stage = stage


@dataclass
class StageRunner:
    """Runs named stages in order under ``out/stages``; finished ones are loaded, not redone.

    A stage's function returns a JSON-able dict. The record is written atomically after
    the function returns, so a stage killed midway is simply run again; stage functions
    must therefore be idempotent (they are: the warehouse and checkpoints resume).
    With ``until`` set, :class:`StoppedAfter` is raised once that stage is done (run now
    or earlier), so a later run without it continues from the next stage.
    """

    out: Path
    console: Console = field(default_factory=lambda: Console(stderr=True))
    records: list[StageRecord] = field(default_factory=list)
    until: str | None = None

    @property
    def directory(self) -> Path:
        return self.out / "stages"

    def path_of(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def run(self, name: str, what: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        path = self.path_of(name)
        if path.is_file():
            saved = json.loads(path.read_text())
            record = StageRecord(name, saved["seconds"], saved["result"], resumed=True)
            self.console.print(f"[dim]✓ {name:<9} {what} (done earlier, {record.seconds:.0f}s)")
            self.records.append(record)
            self._stop_if_asked(name)
            return record.result
        self.console.rule(f"[bold]{name}[/bold]: {what}")
        start = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - start
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seconds": seconds, "result": result}, indent=1))
        os.replace(tmp, path)
        self.records.append(StageRecord(name, seconds, result))
        self.console.print(f"[green]✓ {name:<9}[/green] {what} ({seconds:.1f}s)")
        self._stop_if_asked(name)
        return result

    def _stop_if_asked(self, name: str) -> None:
        if name == self.until:
            raise StoppedAfter(name)

    def summary_lines(self, total_s: float | None = None) -> list[str]:
        """One aligned line per stage (seconds, resumed or not), then ``total`` if given."""
        lines = []
        width = max([9, *(len(r.name) for r in self.records)])
        for r in self.records:
            note = " (resumed)" if r.resumed else ""
            lines.append(f"{r.name:<{width}} {r.seconds:7.1f}s{note}")
        if total_s is not None:
            lines.append(f"{'total':<{width}} {total_s:7.1f}s")
        return lines
