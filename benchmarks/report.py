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


def parse_settings(text: str) -> dict[str, Any]:
    """``"key=value;key=value"`` -> settings to change: each value JSON (numbers,
    true/false/null, lists, objects), anything else a string."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split(";")):
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def settings_text(changes: dict[str, Any]) -> str:
    """:func:`parse_settings`' inverse: the text that parses back to ``changes``."""
    return ";".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in changes.items())


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
    check_sections(text)  # never write into a corrupt page: fix it first (the error says where)
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else f"{text}\n{section}\n"
    check_sections(text)  # e.g. a second section under a heading another one uses
    DOC.parent.mkdir(parents=True, exist_ok=True)
    tmp = DOC.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(DOC)  # atomic: an interrupted run leaves the old page whole


MARKER = re.compile(r"<!-- ([\w.-]+):(begin|end) -->")


def sections(text: str) -> dict[str, str]:
    """Each benchmark section of docs/benchmarks.md by id, its text between the markers.
    ValueError naming the problem when markers are unpaired, nested, out of order or an id
    is used twice."""
    found: dict[str, str] = {}
    open_id, start = None, 0
    for m in MARKER.finditer(text):
        area, kind = m.groups()
        if kind == "begin":
            if open_id is not None:
                raise ValueError(f"section {area!r} begins inside section {open_id!r}")
            if area in found:
                raise ValueError(f"section {area!r} appears twice")
            open_id, start = area, m.end()
        else:
            if open_id != area:
                raise ValueError(f"'{area}:end' closes {open_id or 'no section'!r}")
            found[area], open_id = text[start : m.start()], None
    if open_id is not None:
        raise ValueError(f"section {open_id!r} has no end marker")
    return found


def check_sections(text: str) -> dict[str, str]:
    """:func:`sections`, and each section: one ``## `` heading used by no other section, a
    table, and the line saying when and on what machine it ran. ValueError otherwise."""
    found = sections(text)
    headings: dict[str, str] = {}
    for area, body in found.items():
        titles = re.findall(r"^## (.+)$", body, re.M)
        if len(titles) != 1:
            raise ValueError(f"section {area!r} has {len(titles)} '## ' headings, not 1")
        if titles[0] in headings:
            raise ValueError(f"sections {headings[titles[0]]!r} and {area!r} share the heading "
                             f"{titles[0]!r}")  # fmt: skip
        headings[titles[0]] = area
        if not re.search(r"^\|( ?:?-{3,}:? ?\|)+\s*$", body, re.M):
            raise ValueError(f"section {area!r} has no table")
        if not re.search(r"^_.*20\d\d-\d\d-\d\d.*_\s*$", body, re.M):
            raise ValueError(f"section {area!r} does not say when and where it ran")
    return found


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
