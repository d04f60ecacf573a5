"""The toy pipeline's driver: each stage resumes from its record under ``--out``."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from krea2.infra import UserError
from krea2.pipeline.config import DemoConfig, load_demo_config, smoke_note
from krea2.pipeline.stages import StageRunner, StoppedAfter


def run_demo(
    out: Path,
    quick: bool,
    workers: int | None = None,
    keep_db: bool = False,
    config: Path | None = None,
    overrides: list[str] | None = None,
    until: str | None = None,
) -> dict:
    """Run the demo into ``out`` and return its summary (also written to summary.json).

    ``until``: stop once that stage is done (see :func:`stage_names`) and return
    ``{"stopped_after": until}``; running again without it continues from there.
    """
    cfg = load_demo_config(quick, config, overrides)
    if workers is not None:
        cfg.workers = workers
    if cfg.workers < 1:
        raise UserError(f"--workers {cfg.workers} must be at least 1")
    if until is not None and until not in (names := stage_names(cfg)):
        raise UserError(f"--until {until!r} is not a stage of this recipe: {', '.join(names)}")
    out = out.resolve()  # every run and record under it names absolute paths
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runner = StageRunner(out, until=until)
    from krea2.pipeline import curation

    try:
        summary = _stages(runner, cfg, out)
    except StoppedAfter as stop:
        summary = {"stopped_after": stop.stage}
    finally:
        if not keep_db:
            curation.stop_shards(out)
    typer.echo("")
    lines = runner.summary_lines(time.perf_counter() - start)
    if "stopped_after" in summary:
        lines[-1] += f"  (stopped after {until}; run again without --until to continue)"
    else:
        lines[-1] += f"  ->  {out / 'report.html'}"
    for line in lines:
        typer.echo(line)
    return summary


def stage_names(cfg: DemoConfig) -> list[str]:
    """The demo's stages in the order they run (:func:`krea2.pipeline.recipe.demo_stages`,
    then ``report``)."""
    from krea2.pipeline.recipe import demo_stages, run_order

    return run_order(demo_stages(cfg))


def _stages(runner: StageRunner, cfg: DemoConfig, out: Path) -> dict:
    """Run every stage of :func:`~krea2.pipeline.recipe.demo_stages` in order, then the
    report; print each stage's closing lines. Returns the summary."""
    from krea2.pipeline.demo_run import DemoRun, write_report
    from krea2.pipeline.recipe import demo_stages

    demo, stages = DemoRun(cfg, out), demo_stages(cfg)
    for stage in stages:
        if stage.always:  # recorded or not, this stage runs in every invocation
            runner.path_of(stage.name).unlink(missing_ok=True)
        demo.results[stage.name] = runner.run(
            stage.name, stage.what, lambda stage=stage: stage.run(demo)
        )
    timings = [(r.name, r.seconds) for r in runner.records]
    note = smoke_note(cfg)
    summary = runner.run(
        "report",
        "write report.html and summary.json",
        lambda: write_report(demo, stages, timings, note),
    )
    for stage in [s for s in stages if s.leads] + [s for s in stages if not s.leads]:
        for line in stage.lines(demo) if stage.lines is not None else []:
            typer.echo(line)
    if note:
        typer.secho(note, fg="yellow")
    return summary
