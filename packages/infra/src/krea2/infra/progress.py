"""Progress of a long loop: a rich bar on a terminal, plain periodic lines otherwise.

Training, sampling, curation and the demo all report progress the same way::

    with progress("train 32px", total=800, unit="step") as bar:
        for step in range(800):
            ...
            bar.advance(loss=f"{loss:.4f}")

On a terminal this draws a bar with count, rate, elapsed time and ETA (rich); in a log
file or CI (stderr not a terminal) it writes one line every ``interval_s`` seconds and a
last line at the end, e.g. ``train 32px: 120/800 step (15%), 3.21 step/s, eta 3m32s,
loss=0.1234``. ``KREA2_PROGRESS=plain|bar|off`` forces a mode and
``KREA2_PROGRESS_INTERVAL=<seconds>`` sets the plain lines' spacing for every loop (``0``:
a line per update, e.g. for a log that another program follows). Each loop is also a pause
point named by its description (``KREA2_PAUSE_AT``, :mod:`krea2.infra.pause`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TextIO, TypeVar

from krea2.infra.pause import pause_point

__all__ = ["Progress", "format_duration", "progress", "track"]

T = TypeVar("T")


def format_duration(seconds: float) -> str:
    """``75`` → ``1m15s``; ``4000`` → ``1h06m``; under a minute ``12.3s``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _interval(default_s: float) -> float:
    """Seconds between plain lines: ``KREA2_PROGRESS_INTERVAL`` if set, else the loop's."""
    raw = os.environ.get("KREA2_PROGRESS_INTERVAL", "").strip()
    if not raw:
        return default_s
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"KREA2_PROGRESS_INTERVAL={raw!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"KREA2_PROGRESS_INTERVAL={raw!r} must be >= 0 seconds")
    return value


def _mode(stream: TextIO, enabled: bool) -> str:
    forced = os.environ.get("KREA2_PROGRESS", "").strip().lower()
    if not enabled or forced == "off":
        return "off"
    if forced in ("plain", "bar"):
        return forced
    isatty = getattr(stream, "isatty", None)
    return "bar" if callable(isatty) and isatty() else "plain"


class Progress:
    """One loop's progress; use :func:`progress` to make one.

    ``total`` may be ``None`` (unknown length: no percentage or ETA). Fields passed to
    :meth:`advance`/:meth:`update` (``loss="0.12"``) are shown after the rate.
    """

    def __init__(
        self,
        description: str,
        total: int | None = None,
        *,
        unit: str = "it",
        completed: int = 0,
        interval_s: float = 10.0,
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = completed
        self.interval_s = _interval(interval_s)
        self.stream = stream if stream is not None else sys.stderr
        self.mode = _mode(self.stream, enabled)
        self.fields: dict[str, Any] = {}
        self._start_completed = completed
        self._start = time.monotonic()
        self._last_line = self._start
        self._written: int | None = None  # the count the last plain line showed
        self._bar: Any = None
        self._task: Any = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Progress:
        self._start = self._last_line = time.monotonic()
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[extra]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                self.description, total=self.total, completed=self.completed, rate="", extra=""
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(interrupted=exc_type is not None)

    def close(self, interrupted: bool = False) -> None:
        """Stop the bar, or write the last plain line (marked if the loop did not finish)."""
        if self.mode == "bar" and self._bar is not None:
            self._refresh_bar()
            self._bar.stop()
            self._bar = None
        elif self.mode == "plain" and (interrupted or self.completed != self._written):
            self._write_line(suffix=" (stopped)" if interrupted else "")

    # ------------------------------------------------------------------ updates
    def advance(self, n: int = 1, **fields: Any) -> None:
        """Count ``n`` more units done; ``fields`` replace the shown values."""
        self.update(self.completed + n, **fields)

    def update(
        self, completed: int | None = None, *, total: int | None = None, **fields: Any
    ) -> None:
        """Set the count (and optionally the total) directly."""
        if completed is not None:
            self.completed = completed
        if total is not None:
            self.total = total
        self.fields.update(fields)
        if self.mode == "bar":
            self._refresh_bar()
        elif self.mode == "plain":
            now = time.monotonic()
            if now - self._last_line >= self.interval_s:
                self._write_line()
        pause_point(self.description, self.completed)  # tests' stop points (krea2.infra.pause)

    # ------------------------------------------------------------------ figures
    def rate(self) -> float:
        """Units per second since the start (0 before the first unit)."""
        elapsed = time.monotonic() - self._start
        done = self.completed - self._start_completed
        return done / elapsed if elapsed > 0 and done > 0 else 0.0

    def eta_s(self) -> float | None:
        """Seconds left at the current rate, or ``None`` when unknown."""
        rate = self.rate()
        if self.total is None or rate <= 0:
            return None
        return max(0.0, (self.total - self.completed) / rate)

    def line(self) -> str:
        """The plain-text status line."""
        parts = [
            f"{self.completed}/{self.total} {self.unit}"
            if self.total
            else f"{self.completed} {self.unit}"
        ]
        if self.total:
            parts[0] += f" ({100 * self.completed / self.total:.0f}%)"
        rate = self.rate()
        if rate > 0:
            parts.append(f"{rate:.3g} {self.unit}/s")
        parts.append(f"elapsed {format_duration(time.monotonic() - self._start)}")
        eta = self.eta_s()
        if eta is not None and self.completed < (self.total or 0):
            parts.append(f"eta {format_duration(eta)}")
        parts += [f"{key}={value}" for key, value in self.fields.items()]
        return f"{self.description}: " + ", ".join(parts)

    def _write_line(self, suffix: str = "") -> None:
        self._last_line = time.monotonic()
        self._written = self.completed
        print(self.line() + suffix, file=self.stream, flush=True)

    def _refresh_bar(self) -> None:
        rate = self.rate()
        extra = " ".join(f"{key}={value}" for key, value in self.fields.items())
        self._bar.update(
            self._task,
            completed=self.completed,
            total=self.total,
            rate=f"{rate:.3g} {self.unit}/s" if rate > 0 else "",
            extra=extra,
        )


def progress(
    description: str,
    total: int | None = None,
    *,
    unit: str = "it",
    completed: int = 0,
    interval_s: float = 10.0,
    stream: TextIO | None = None,
    enabled: bool = True,
) -> Progress:
    """A :class:`Progress` to use as a context manager (see the module docstring)."""
    return Progress(
        description,
        total,
        unit=unit,
        completed=completed,
        interval_s=interval_s,
        stream=stream,
        enabled=enabled,
    )


def track(
    items: Iterable[T],
    description: str,
    total: int | None = None,
    *,
    unit: str = "it",
    interval_s: float = 10.0,
    stream: TextIO | None = None,
) -> Iterator[T]:
    """Iterate ``items``, reporting one unit per item."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(description, total, unit=unit, interval_s=interval_s, stream=stream) as bar:
        for item in items:
            yield item
            bar.advance()
