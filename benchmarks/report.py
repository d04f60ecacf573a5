"""Benchmark output: JSON under benchmarks/results/ and a section of docs/benchmarks.md."""

from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by one script in `benchmarks/` (run it to refresh the section);\n"
    "peers are measured side by side in the same run. Raw numbers: `benchmarks/results/`.\n"
)


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_results(area: str, results: dict[str, Any], markdown: str) -> None:
    """Save ``results`` as JSON and replace this area's section of docs/benchmarks.md."""
    results = {
        "area": area,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        **results,
    }
    out = ROOT / "benchmarks" / "results" / f"{area}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    begin, end = f"<!-- {area}:begin -->", f"<!-- {area}:end -->"
    section = f"{begin}\n{markdown.strip()}\n\n_{results['when']}, {results['machine']}._\n{end}"
    text = DOC.read_text() if DOC.exists() else HEADER
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else f"{text}\n{section}\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
