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
    quick: bool = typer.Option(False, "--quick", help="Small pool and few steps (1-3 min)."),
    workers: int = typer.Option(None, "--workers", help="Curation worker processes per job."),
    keep_db: bool = typer.Option(False, "--keep-db", help="Leave the embedded shards running."),
    config: Path = typer.Option(
        None, "--config", help="Demo recipe TOML (default: the packaged one; see --show-config)."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a setting, e.g. --set train.stages.0.steps=500."
    ),
    show_config: bool = typer.Option(
        False, "--show-config", help="Print the packaged recipe (with --quick: the quick one)."
    ),
    until: str = typer.Option(
        None,
        "--until",
        help="Stop after this stage (e.g. export-64, pretrain; --list-stages names them all); "
        "a later run without it continues.",
    ),
    list_stages: bool = typer.Option(
        False, "--list-stages", help="Print the recipe's stages in the order they run."
    ),
) -> None:
    """Run the Krea 2 pipeline at toy scale: curate, pretrain at two resolutions, then
    post-train in one chain (domain SFTs merged, STPO, RL without CFG) into the final
    model, raw, with the ablations (DPO, the other merges) as branches; measure the chain,
    and put the prompt expander (SFT + GDPO) in front of raw.

    Example: krea2 demo --quick --out demo-out

    Example: krea2 demo --quick --out demo-out --until curate
    """
    if list_stages:
        from krea2.pipeline.config import load_demo_config
        from krea2.pipeline.demo import stage_names

        typer.echo("\n".join(stage_names(load_demo_config(quick, config, set_))))
        return
    if show_config:
        from krea2.pipeline.config import recipe_text

        typer.echo(recipe_text(quick), nl=False)
        return
    from krea2.pipeline.demo import run_demo

    run_demo(out, quick, workers, keep_db, config, set_, until)
