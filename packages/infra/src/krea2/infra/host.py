"""The ``krea2`` console command: a typer app whose sub-commands are discovered lazily.

Every installed krea2 package registers a typer app (or a plain function) under the
entry-point group ``krea2.cli``. Sub-apps are imported only when invoked, so
``krea2 --help`` stays fast and a plugin that fails to import prints one line naming it
instead of taking the whole CLI down.

A command group can also gain sub-commands from other packages: an entry point named
``NAME`` in the group ``krea2.cli.GROUP`` becomes ``krea2 GROUP NAME`` (the group's own
command of that name wins). This lets a package that may not be imported by the group's
package add to it, e.g. the umbrella registers ``krea2 train prepare`` (curate's folder
preparation) although krea2-trainer must not depend on krea2-curate.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperGroup

from krea2.infra.errors import UserError
from krea2.infra.quiet import drop_import_notices
from krea2.infra.termination import TERMINATED_EXIT_CODE, sigterm_as_interrupt, terminated

ENTRY_POINT_GROUP = "krea2.cli"


def krea2_distributions() -> dict[str, str]:
    """Installed distributions named ``krea2`` or ``krea2-*``, mapped to their versions."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "krea2" or name.startswith("krea2-"):
            found[name] = dist.version
    return dict(sorted(found.items()))


def plugin_entry_points() -> dict[str, metadata.EntryPoint]:
    """Entry points of the ``krea2.cli`` group, by command name."""
    return {
        ep.name: ep
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    }


def _summary(ep: metadata.EntryPoint) -> str:
    """One line for ``krea2 --help``, found without importing the plugin.

    A plain-function command is described by its own docstring (read from the source
    file with ``ast``), since a distribution's summary describes the whole distribution
    (the umbrella's is the project tagline, not what ``demo`` does); a typer app falls
    back to its distribution's summary, minus the ``krea2.<name>: `` prefix.
    """
    doc = _function_docstring(ep)
    if doc:
        return summary_line(doc)
    dist = ep.dist
    summary = (dist.metadata["Summary"] or "") if dist is not None else ""
    return summary.split(": ", 1)[-1] if summary.startswith("krea2.") else summary


def _function_docstring(ep: metadata.EntryPoint) -> str | None:
    """The docstring of a module-level function entry point, or None (never imports it)."""
    try:
        spec = importlib.util.find_spec(ep.module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == ep.attr:
            return ast.get_docstring(node)
    return None


# A line that starts a new item of a help paragraph instead of continuing the one before:
# a bullet, a numbered step, an example.
_ITEM = re.compile(r"^(?:[-*•] |\d+[.)] |Examples?:|\$ )")


def reflow_help(text: str | None) -> str | None:
    """Help text whose paragraphs are single lines, so the terminal (rich) wraps them.

    Docstrings are wrapped at the source's width; typer keeps their line breaks, which
    leaves ragged lines (``record their text conditioning, / prediction / and shift``) at
    any other width. Each line is joined to the one before unless it starts an item
    (bullet, numbered step, ``Example:``); an indented paragraph (code) and click's ``\\b``
    blocks are kept as written; a ``\\f`` tail is kept."""
    if not text:
        return text
    head, sep, tail = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for paragraph in head.split("\n\n"):
        lines = paragraph.split("\n")
        if paragraph[:1] in ("\b", " ", "\t"):  # click's no-rewrap marker, or code
            paragraphs.append(paragraph)
            continue
        joined: list[str] = []
        for line in lines:
            if joined and not _ITEM.match(line):
                joined[-1] = f"{joined[-1]} {line.strip()}"
            else:
                joined.append(line.strip())
        paragraphs.append("\n".join(joined))
    return "\n\n".join(paragraphs) + sep + tail


def summary_line(text: str | None) -> str:
    """The first paragraph of a help text as one line: a command's summary in listings."""
    return (reflow_help(text) or "").split("\n\n")[0].split("\n")[0].strip()


def reflow_tree(command: Any) -> Any:
    """:func:`reflow_help` applied to ``command`` and every command under it (in place)."""
    command.help = reflow_help(command.help)
    for sub in getattr(command, "commands", {}).values():
        reflow_tree(sub)
    return command


def as_click_command(obj: Any, name: str) -> click.Command:
    """Turn a plugin object (a ``typer.Typer`` or a plain function) into a click command."""
    if isinstance(obj, typer.Typer):
        command = typer.main.get_command(obj)
    elif isinstance(obj, click.Command):
        command = obj
    elif callable(obj):
        single = typer.Typer()
        single.command(name=name)(obj)
        command = typer.main.get_command(single)
    else:
        raise TypeError(
            f"entry point {name!r} is a {type(obj).__name__}, not a typer app or function"
        )
    command.name = name
    return reflow_tree(command)


class PluginLoadError(click.ClickException):
    """A registered sub-command could not be imported."""

    exit_code = 1


class _PluginSummary(click.Command):
    """Stands in for a plugin in help listings, so listing never imports it."""

    def __init__(self, ep: metadata.EntryPoint) -> None:
        summary = _summary(ep)
        super().__init__(ep.name, help=summary, short_help=summary)
        self.entry_point = ep


class LazyPluginGroup(TyperGroup):
    """Root group: lists plugins from metadata, imports one only when it is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(plugin_entry_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        own = super().get_command(ctx, cmd_name)
        if own is not None:
            return own
        ep = plugin_entry_points().get(cmd_name)
        return _PluginSummary(ep) if ep is not None else None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if isinstance(command, _PluginSummary):
            command = load_plugin(command.entry_point)
        return name, command, rest


def load_plugin(ep: metadata.EntryPoint, where: str = "") -> click.Command:
    """Import one plugin; any failure becomes one line naming the plugin and its module.
    A group gets the sub-command plugins registered for it (:func:`add_subcommands`)."""
    try:
        command = as_click_command(ep.load(), ep.name)
    except Exception as exc:  # a broken plugin must not take the CLI down
        raise _load_error(ep, where, exc) from None
    if not where:
        add_subcommands(command, ep.name)
    return command


def _load_error(ep: metadata.EntryPoint, where: str, exc: Exception) -> PluginLoadError:
    dist = ep.dist.metadata["Name"] if ep.dist is not None else "unknown distribution"
    return PluginLoadError(
        f"the '{where}{ep.name}' command ({ep.value}, from {dist}) failed to load: "
        f"{type(exc).__name__}: {exc}"
    )


def subcommand_entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """Entry points of the ``krea2.cli.<group>`` group, by sub-command name."""
    eps = metadata.entry_points(group=f"{ENTRY_POINT_GROUP}.{group}")
    return {ep.name: ep for ep in sorted(eps, key=lambda e: e.name)}


def add_subcommands(command: click.Command, group: str) -> None:
    """Add the ``krea2.cli.<group>`` plugins to ``command`` when it is a group (duck-typed:
    typer may vendor its own click). A plugin that fails to import becomes a sub-command
    that prints which one failed and why, so the group's other commands still run."""
    if not (hasattr(command, "commands") and hasattr(command, "add_command")):
        return
    for name, ep in subcommand_entry_points(group).items():
        if name in command.commands:  # the group's own command of that name wins
            continue
        try:
            sub = load_plugin(ep, where=f"{group} ")
        except PluginLoadError as exc:
            sub = as_click_command(_failing(exc, ep), name)
        command.add_command(sub, name)


def _failing(exc: PluginLoadError, ep: metadata.EntryPoint) -> Callable[[], None]:
    def broken() -> None:
        raise exc

    broken.__doc__ = f"(failed to load: {ep.value})"
    return broken


app = typer.Typer(
    cls=LazyPluginGroup,
    name="krea2",
    help=(
        "krea2: an open re-implementation of the Krea 2 system.\n\n"
        "Example: krea2 demo --quick  (runs the toy pipeline end to end)"
    ),
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if not value:
        return
    dists = krea2_distributions()
    if not dists:
        typer.echo("no krea2 distributions are installed")
    for name, version in dists.items():
        typer.echo(f"{name} {version}")
    raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        help="List installed krea2 distributions and their versions.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """krea2: an open re-implementation of the Krea 2 system."""


def _exception_classes(name: str) -> tuple[type[BaseException], ...]:
    """``click.exceptions.<name>`` and typer's vendored copy of it, where typer has one.

    Typer ≥ 0.20 ships its own copy of click (``typer._click``) whose exceptions are not
    subclasses of click's, so the host must catch both to treat a usage error as one.
    """
    found: list[type[BaseException]] = [getattr(click.exceptions, name)]
    for module in ("typer._click.exceptions", "typer.exceptions"):
        try:
            vendored = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(vendored, type) and vendored not in found:
            found.append(vendored)
    return tuple(found)


_CLICK_ERRORS = _exception_classes("ClickException")
_ABORTS = _exception_classes("Abort")
_EXITS = _exception_classes("Exit")
INTERRUPTED_EXIT_CODE = 130


def _interrupted() -> int:
    """The one line and exit status of a stopped command: Ctrl-C 130, SIGTERM 143."""
    if terminated():
        typer.secho("terminated", err=True, fg="yellow")
        return TERMINATED_EXIT_CODE
    typer.secho("interrupted", err=True, fg="yellow")
    return INTERRUPTED_EXIT_CODE


def run_cli(command: Callable[..., Any] | click.Command, args: list[str] | None = None) -> int:
    """Run a click or typer command and return its exit status.

    * :class:`UserError`: one ``error:`` line, its exit code (2);
    * usage errors (click's or typer's vendored click): click's one-line message with the
      usage line, exit 2;
    * Ctrl-C (``KeyboardInterrupt``, which typer turns into ``Exit(130)``): ``interrupted``
      and exit 130, so ``krea2 a && krea2 b`` never goes on after an interrupted ``a``.
    """
    click_command = (
        command if isinstance(command, click.Command) else typer.main.get_command(command)
    )
    reflow_tree(click_command)
    try:
        with sigterm_as_interrupt():  # a scheduler's SIGTERM stops it as Ctrl-C does
            result = click_command.main(args=args, prog_name="krea2", standalone_mode=False)
    except UserError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        return exc.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except _ABORTS:
        return _interrupted()
    except _CLICK_ERRORS as exc:
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    except _EXITS as exc:
        code = int(exc.exit_code)  # type: ignore[attr-defined]
        return _interrupted() if code == INTERRUPTED_EXIT_CODE else code
    # In non-standalone mode typer returns the code of an ``Exit`` raised inside (its
    # Ctrl-C handler raises ``Exit(130)``) instead of raising it; a command's own
    # return value is data, not a status, so only an int from that path counts.
    if isinstance(result, int) and not isinstance(result, bool):
        return _interrupted() if result == INTERRUPTED_EXIT_CODE else result
    return 0


def main() -> None:
    """Console entry point of ``krea2``."""
    drop_import_notices()  # every command, whichever package imports transformers/diffusers
    sys.exit(run_cli(app))
