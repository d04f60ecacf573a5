"""``krea2 demo``: the report's pipeline end to end at toy scale on embedded defaults."""

from __future__ import annotations

from pathlib import Path

import typer

STAGES = (
    ("shards", "start 2 embedded krablet shards", "krea2.krablet"),
    ("pool", "generate a ShapesWorld raw pool with injected defects", "krea2.curate.shapes"),
    ("curate", "ingest and run every curate job with worker processes", "krea2.curate"),
    ("export", "export Parquet shards at a low and a high resolution", "krea2.curate"),
    ("pretrain", "pretrain a tiny DiT at the low, then the high resolution", "krea2.trainer"),
    ("sample", "sample held-out prompts with fixed seeds", "krea2.dit"),
    ("score", "score samples with the rubric verifier (ShapesEval)", "krea2.curate.shapes"),
    ("report", "write report.html and summary.json", "krea2.pipeline"),
)


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
