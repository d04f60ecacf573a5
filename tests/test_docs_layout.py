"""The docs keep three kinds of page apart (docs/README.md): reference, design and generated
results. No hand-written results pages, no lab-notebook headings, every design page indexed,
and every relative link to a Markdown file lands on one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = {DOCS / "benchmarks.md"}  # written by the benchmark scripts, dated by them
PAGES = sorted([ROOT / "README.md", *DOCS.glob("**/*.md"), *ROOT.glob("packages/*/README.md")])

DATED_HEADING = re.compile(r"^#+ .*20\d\d-\d\d-\d\d")
FENCE = re.compile(r"^\s*```")
# [text](target) where target is a relative path to a .md file, with an optional #anchor
MD_LINK = re.compile(r"\]\((?!https?://|mailto:|#)(?P<path>[^)\s#]+\.md)(?:#[^)\s]*)?\)")


def prose_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, line) outside fenced blocks."""
    out, fenced = [], False
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_there_are_no_hand_written_results_pages():
    assert not (DOCS / "results").exists(), (
        "docs/results/ is gone: put why a setting is what it is in docs/design/, the history "
        "in the package's CHANGELOG.md, and generated tables in docs/benchmarks.md"
    )


def test_every_design_page_is_linked_from_the_docs_index():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    design = sorted((DOCS / "design").glob("*.md"))
    assert design, "docs/design/ holds no page"
    missing = [rel(p) for p in design if f"](design/{p.name})" not in index]
    assert not missing, f"not linked from docs/README.md: {missing}"


def test_no_doc_page_has_a_dated_heading():
    """Design and reference pages state current truth by topic; dates belong in changelogs."""
    dated = [
        f"{rel(page)}:{n}: {line}"
        for page in sorted(DOCS.glob("**/*.md"))
        if page not in GENERATED
        for n, line in prose_lines(page)
        if DATED_HEADING.match(line)
    ]
    assert not dated, "headings that start a diary entry:\n" + "\n".join(dated)


def test_every_relative_markdown_link_resolves():
    broken = [
        f"{rel(page)}:{n}: {m['path']}"
        for page in PAGES
        for n, line in prose_lines(page)
        for m in MD_LINK.finditer(line)
        if not (page.parent / m["path"]).resolve().is_file()
    ]
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_the_link_check_sees_relative_links_and_skips_others():
    line = "see [a](design/rl.md#x), [b](../CHANGELOG.md), [c](https://x.org/a.md), [d](#y)"
    assert [m["path"] for m in MD_LINK.finditer(line)] == ["design/rl.md", "../CHANGELOG.md"]
