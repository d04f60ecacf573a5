"""Every ``krea2`` command's help carries an example, and every example is a real command.

The examples are read from the installed CLI (all plugins loaded), split at ``&&``, and
each ``krea2 …`` part must name an existing command and only options that command has.
Those whose inputs need no earlier step run for real here; the rest run in the docs'
command blocks (tests/test_docs_commands.py), which walk each flow from its first step.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from krea2.infra import host

KREA2 = [sys.executable, "-c", "from krea2.infra.host import main; main()"]
# Examples that need nothing made by an earlier command; each runs in a scratch folder.
SELF_CONTAINED = ("krea2 dit flops --config krea2-12b --size 1024x1024",)


def root() -> Any:
    return host.typer.main.get_command(host.app)


# Typer ≥ 0.20 builds commands on its own copy of click, so commands are told apart by
# what they can do, not by click's classes.
def is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def context(command: Any, parent: Any = None) -> Any:
    return command.context_class(command, parent=parent)


def subcommand(group: Any, ctx: Any, name: str) -> Any:
    command = group.get_command(ctx, name)
    if command is not None and hasattr(command, "entry_point"):
        command = host.load_plugin(command.entry_point)  # the listing's stand-in
    return command


def walk(group: Any, ctx: Any, path: tuple[str, ...] = ()) -> Iterator[tuple]:
    """(path, command) of every command under ``group``, plugins loaded."""
    for name in group.list_commands(ctx):
        command = subcommand(group, ctx, name)
        if command is None or command.hidden:
            continue
        yield (*path, name), command
        if is_group(command):
            yield from walk(command, context(command, ctx), (*path, name))


def commands() -> list[tuple[tuple[str, ...], Any]]:
    group = root()
    return list(walk(group, context(group)))


def examples(command: Any) -> list[str]:
    """The text after each ``Example:`` up to the end of its paragraph, one line each."""
    found = []
    for paragraph in re.split(r"\n\s*\n", command.help or ""):
        flat = " ".join(paragraph.split())
        if "Example:" in flat:
            found.append(flat.split("Example:", 1)[1].strip())
    return found


def krea2_parts(example: str) -> list[list[str]]:
    """The ``krea2 …`` commands of an example line, as argument lists (an env prefix and
    a closing remark in parentheses dropped)."""
    parts = []
    for segment in re.split(r"&&|;", example):
        words = shlex.split(re.sub(r"\s*\([^()]*\)\s*$", "", segment))
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            words = words[1:]
        if words and words[0] == "krea2":
            parts.append(words[1:])
    return parts


def resolve(args: list[str]) -> tuple[Any, list[str]]:
    """The command that ``krea2 ARGS`` runs and the arguments left for it."""
    command = root()
    ctx = context(command)
    while is_group(command) and args and not args[0].startswith("-"):
        sub = subcommand(command, ctx, args[0])
        assert sub is not None, f"no command {args[0]!r}"
        command, args = sub, args[1:]
        ctx = context(command, ctx)
    return command, args


COMMANDS = commands()


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_has_an_example_that_names_real_options(path, command):
    found = examples(command)
    assert found, f"`krea2 {' '.join(path)} --help` has no 'Example: krea2 ...' line"
    for example in found:
        parts = krea2_parts(example)
        assert parts, f"example {example!r} runs no krea2 command"
        for args in parts:
            target, rest = resolve(args)
            options = {opt for p in target.params for opt in (*p.opts, *p.secondary_opts)}
            for word in rest:
                if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
                    name = word.split("=", 1)[0]
                    assert name in options, f"{example!r}: {name} is not an option of {target.name}"


def test_every_subcommand_is_reached_by_the_walk():
    names = {p[0] for p, _ in COMMANDS}
    assert set(host.plugin_entry_points()) <= names


@pytest.mark.parametrize("example", SELF_CONTAINED)
def test_self_contained_examples_run(example: str, tmp_path: Path) -> None:
    assert any(example in " ".join(examples(c)) for _, c in COMMANDS), "not a help example"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [*KREA2, *shlex.split(example)[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()


# --- help that renders ----------------------------------------------------------------------


def test_every_summary_is_a_whole_sentence_on_one_line():
    # the listing shows a command's first paragraph: cut mid-sentence, it reads as a bug
    for path, command in commands():
        summary = host.summary_line(command.help)
        assert summary.endswith((".", "!", "?", ")")), f"krea2 {' '.join(path)}: {summary!r}"
    for ep in host.plugin_entry_points().values():  # the root's listing, read without imports
        assert host._summary(ep).endswith((".", ")")), ep.name


def test_help_paragraphs_are_reflowed_so_the_terminal_wraps_them():
    for path, command in commands():
        assert host.reflow_help(command.help) == command.help, " ".join(path)
    text = "First line\nof a sentence.\n\n- item one\n  goes on\n- item two\nExample: krea2 a\n--b"
    assert host.reflow_help(text) == (
        "First line of a sentence.\n\n- item one goes on\n- item two\nExample: krea2 a --b"
    )
    code = "Run this:\n\n    krea2 demo\n    --quick\n\nThen open the report."
    assert host.reflow_help(code) == code  # indented blocks are kept as written


@pytest.mark.parametrize("path", [("dit", "sample"), ("train",), ()], ids=" ".join)
def test_help_renders_at_80_columns_without_ragged_lines(path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    assert host.run_cli(host.app, [*path, "--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and max(len(line) for line in lines) <= 80
    # a ragged break leaves a line of one or two words inside a paragraph
    description = out.split("╭")[0]
    for line, after in itertools.pairwise(description.splitlines()):
        words = line.split()
        if after.strip() and 0 < len(words) <= 2 and not line.strip().startswith("Usage"):
            pytest.fail(f"ragged line {line!r} before {after!r}")


def test_every_help_renders_at_80_columns(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    for path, _ in commands():
        assert host.run_cli(host.app, [*path, "--help"]) == 0, " ".join(path)
        lines = capsys.readouterr().out.splitlines()
        assert lines and max(len(line) for line in lines) <= 80, " ".join(path)


# Each package's reference page (docs/<page>.md) names every sub-command of its group.
DOC_PAGE = {"train": "trainer"}


def test_every_sub_command_is_in_its_packages_reference_page():
    docs = Path(__file__).resolve().parents[1] / "docs"
    missing = []
    for path, command in commands():
        if len(path) < 2 or is_group(command):
            continue
        page = docs / f"{DOC_PAGE.get(path[0], path[0])}.md"
        if page.exists() and f"krea2 {' '.join(path)}" not in page.read_text():
            missing.append(f"krea2 {' '.join(path)} ({page.name})")
    assert not missing, f"sub-commands no reference page shows: {missing}"
