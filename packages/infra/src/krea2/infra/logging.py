"""One logging setup for every krea2 process: rich for people, JSON lines for machines.

Records carry the process id and, under torchrun, the global rank, so logs of a
multi-rank job can be merged and filtered.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

_CONFIGURED_HANDLERS: list[logging.Handler] = []
_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


def process_rank() -> int | None:
    """The global rank under torchrun/SLURM (``RANK`` or ``SLURM_PROCID``), else None."""
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


class _RankFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.rank = process_rank()

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: time (unix seconds), level, logger, message, pid, rank, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "rank": getattr(record, "rank", None),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key not in out:
                out[key] = (
                    value if isinstance(value, str | int | float | bool | None) else repr(value)
                )
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(
    level: str | int = "INFO",
    json_lines: bool = False,
    file: str | Path | None = None,
) -> logging.Logger:
    """Configure the ``krea2`` logger tree once per process (calling again reconfigures it).

    Args:
        level: threshold, e.g. ``"INFO"`` or ``logging.DEBUG``.
        json_lines: write JSON lines to stderr instead of rich, human-readable lines.
        file: also append JSON lines to this file (always JSON: it is for machines).
    """
    root = logging.getLogger("krea2")
    for handler in _CONFIGURED_HANDLERS:
        root.removeHandler(handler)
        handler.close()
    _CONFIGURED_HANDLERS.clear()

    rank_filter = _RankFilter()
    if json_lines or not sys.stderr.isatty():
        stream: logging.Handler = logging.StreamHandler(sys.stderr)
        stream.setFormatter(
            JsonLinesFormatter() if json_lines else _plain_formatter(rank_filter.rank)
        )
    else:
        from rich.logging import RichHandler

        stream = RichHandler(show_path=False, rich_tracebacks=True, log_time_format="%H:%M:%S")
        if rank_filter.rank is not None:
            stream.setFormatter(logging.Formatter(f"[rank {rank_filter.rank}] %(message)s"))
    handlers = [stream]
    if file is not None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(file, encoding="utf-8")
        to_file.setFormatter(JsonLinesFormatter())
        handlers.append(to_file)
    for handler in handlers:
        handler.addFilter(rank_filter)
        root.addHandler(handler)
        _CONFIGURED_HANDLERS.append(handler)
    root.setLevel(level)
    root.propagate = False
    return root


def _plain_formatter(rank: int | None) -> logging.Formatter:
    where = f"rank {rank} " if rank is not None else ""
    fmt = logging.Formatter(f"%(asctime)s {where}%(levelname)s %(name)s: %(message)s")
    fmt.converter = time.gmtime
    return fmt


def get_logger(name: str) -> logging.Logger:
    """A logger under the ``krea2`` tree.

    ``get_logger("krablet.queue")`` is the logger ``krea2.krablet.queue``.
    """
    return logging.getLogger(name if name.startswith("krea2") else f"krea2.{name}")
