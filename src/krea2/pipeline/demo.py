"""The toy pipeline's driver: runs each stage whose building blocks are installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import typer

from krea2.infra.errors import UserError
from krea2.pipeline.cli import STAGES


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def run_demo(out: Path, quick: bool, workers: int, keep_db: bool) -> None:
    """Run the demo into ``out`` (resuming finished stages)."""
    if workers < 1:
        raise UserError(f"--workers {workers} must be at least 1")
    typer.echo(f"krea2 demo -> {out} ({'quick' if quick else 'full'}, {workers} workers)")
    missing = []
    for name, what, module in STAGES:
        state = "ready" if available(module) else "not built yet"
        typer.echo(f"  {name:<9} {what:<58} [{module}: {state}]")
        if state != "ready":
            missing.append(name)
    raise UserError(
        "the end-to-end demo is not wired up yet (issue 7); stages whose packages are "
        f"missing: {', '.join(missing) or 'none'}. Run `uv run pytest` to exercise each package."
    )
