"""``krea2 demo``: the report's pipeline end to end at toy scale on embedded defaults."""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    out: Path = typer.Option(
        Path("demo-out"),
        "--out",
        help="Directory for the warehouse, "
        "shards, checkpoints and the report; re-use it to resume.",
    ),
    quick: bool = typer.Option(False, "--quick", help="Small pool and few steps (about 3 min)."),
    workers: int = typer.Option(None, "--workers", help="Curation worker processes per job."),
    keep_db: bool = typer.Option(False, "--keep-db", help="Leave the embedded shards running."),
    config: Path = typer.Option(
        None, "--config", help="Demo TOML (default: configs/toy/demo.toml)."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a setting, e.g. --set low.steps=500."
    ),
) -> None:
    """Run the Krea 2 pipeline at toy scale: curate, pretrain at two resolutions, sample, score.

    Example: krea2 demo --quick --out demo-out
    """
    from krea2.pipeline.demo import run_demo

    run_demo(out, quick, workers, keep_db, config, set_)
