"""docs/benchmarks.md stays whole: one section per benchmark id between paired markers,
each with its own heading, a table and the machine it ran on; a script replaces only its
own section and refuses to write into a corrupt page. The scripts run as modules
(`python -m benchmarks.<name>`), as every doc says, and none edits sys.path."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = load_report()

SECTION = (
    "## {title}\n\nWhat it measures.\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\n"
    "_2026-12-05 10:00 UTC, x86_64, 2 CPUs._"
)


def page(*parts: tuple[str, str]) -> str:
    body = "\n\n".join(f"<!-- {a}:begin -->\n{SECTION.format(title=t)}\n<!-- {a}:end -->"
                       for a, t in parts)  # fmt: skip
    return "# Benchmarks\n\n" + body + "\n"


def test_the_committed_page_is_whole():
    found = report.check_sections((ROOT / "docs" / "benchmarks.md").read_text())
    assert {"curate", "queue", "trainer", "dit", "gpu"} <= set(found)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("<!-- a:begin -->\nx\n", "has no end marker"),
        ("<!-- a:begin -->\n<!-- b:begin -->\n<!-- b:end -->\n<!-- a:end -->", "inside section"),
        ("<!-- a:begin -->\nx\n<!-- b:end -->", "closes 'a'"),
        (page(("a", "One"), ("b", "Two")) + page(("a", "Three")), "appears twice"),
        (page(("a", "One"), ("b", "One")), "share the heading"),
        (page(("a", "One")).replace("| --- | --- |", ""), "has no table"),
        (page(("a", "One")).replace("_2026-12-05 10:00 UTC, x86_64, 2 CPUs._", ""), "when and"),
    ],
)
def test_a_corrupt_page_is_named(text, problem):
    with pytest.raises(ValueError, match=problem):
        report.check_sections(text)


def test_a_script_replaces_only_its_own_section(tmp_path, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(page(("a", "One"), ("b", "Two")))
    monkeypatch.setattr(report, "DOC", doc)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    table = "| x |\n| --- |\n| 3 |"
    report.write_results("b", {"n": 3}, f"## Two, again\n\n{table}")
    report.write_results("c", {"n": 4}, f"## Three\n\n{table}")
    found = report.check_sections(doc.read_text())
    assert list(found) == ["a", "b", "c"]
    assert found["a"] == report.sections(page(("a", "One")))["a"]  # untouched, byte for byte
    assert "## Two, again" in found["b"] and "| 1 | 2 |" not in found["b"]
    assert json.loads((tmp_path / "benchmarks" / "results" / "c.json").read_text())["n"] == 4


def test_a_script_refuses_a_corrupt_page_and_leaves_it_as_it_was(tmp_path, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    broken = page(("a", "One")) + "<!-- b:begin -->\n## Two\n"
    doc.write_text(broken)
    monkeypatch.setattr(report, "DOC", doc)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="'b' has no end marker"):
        report.write_results("a", {}, "## One\n\n| x |\n| --- |")
    with pytest.raises(ValueError, match="share the heading"):
        doc.write_text(page(("a", "One")))
        report.write_results("b", {}, "## One\n\n| x |\n| --- |")
    assert doc.read_text() == page(("a", "One"))


# The scripts run as modules from the root (`python -m benchmarks.<name>`: the root is then on
# sys.path, so `from benchmarks.report import ...` resolves and no script edits sys.path).
BY_PATH = re.compile(r"python3?\s+(?:\./)?benchmarks/(\w+)\.py")
EDITS_SYS_PATH = re.compile(r"sys\.path\s*(?:\.(?:insert|append|extend)\b|\[|\+?=)")


def lines_of(paths):
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            yield f"{path.relative_to(ROOT)}:{n}", line


def test_no_benchmark_script_edits_sys_path():
    edits = [f"{where}: {line.strip()}"
             for where, line in lines_of(sorted(ROOT.glob("benchmarks/*.py")))
             if EDITS_SYS_PATH.search(line)]  # fmt: skip
    assert not edits, "\n".join(["run it as `python -m benchmarks.<name>` instead:", *edits])


def test_benchmark_scripts_are_run_as_modules_everywhere_they_are_documented():
    texts = [ROOT / "README.md", *ROOT.glob("packages/*/README.md"), *ROOT.glob("docs/**/*.md"),
             *ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob(".ci/*"),
             *ROOT.glob(".github/**/*")]  # fmt: skip
    texts = [p for p in texts if p.is_file()]
    by_path = [f"{where}: {m[0]!r} -> 'python -m benchmarks.{m[1]}'"
               for where, line in lines_of(texts) for m in BY_PATH.finditer(line)]  # fmt: skip
    assert not by_path, "\n".join(by_path)
