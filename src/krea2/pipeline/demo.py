"""The toy pipeline's driver: each stage resumes from its record under ``--out``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import typer

from krea2.infra.errors import UserError
from krea2.pipeline.config import DemoConfig, load_demo_config
from krea2.pipeline.stages import StageRunner


def run_demo(
    out: Path,
    quick: bool,
    workers: int | None = None,
    keep_db: bool = False,
    config: Path | None = None,
    overrides: list[str] | None = None,
) -> dict:
    """Run the demo into ``out`` and return its summary (also written to summary.json)."""
    cfg = load_demo_config(quick, config, overrides)
    if workers is not None:
        cfg.workers = workers
    if cfg.workers < 1:
        raise UserError(f"--workers {cfg.workers} must be at least 1")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runner = StageRunner(out)
    from krea2.pipeline import curation

    try:
        summary = _stages(runner, cfg, out)
    finally:
        if not keep_db:
            curation.stop_shards(out)
    typer.echo("")
    for line in runner.summary_lines():
        typer.echo(line)
    typer.echo(f"total     {time.perf_counter() - start:7.1f}s  ->  {out / 'report.html'}")
    return summary


def _stages(runner: StageRunner, cfg: DemoConfig, out: Path) -> dict:
    from krea2.pipeline import curation, evaluation, report, training
    from krea2.pipeline.pool import build_pool
    from krea2.pipeline.world import eval_prompt, split_concepts

    log = out / "commands.log"
    split = split_concepts(cfg.pool.seed, cfg.pool.held_out_fraction)
    held_out = list(split.held_out[: cfg.eval.max_prompts])
    prompts = [eval_prompt(c) for c in held_out]
    # The shards must run in every invocation, so this stage is never skipped.
    runner.path_of("shards").unlink(missing_ok=True)
    cluster = Path(
        runner.run(
            "shards",
            f"start {cfg.shards} embedded krablet shards",
            lambda: {"cluster": str(curation.start_shards(out, cfg.shards))},
        )["cluster"]
    )
    pool = runner.run(
        "pool",
        "generate the raw ShapesWorld pool with injected defects",
        lambda: build_pool(cfg.pool, split, out / "pool", cfg.workers),
    )
    labels = Path(pool["labels"])
    curated = runner.run(
        "curate",
        f"ingest and curate with {cfg.workers} worker processes per job",
        lambda: curation.curate_pool(out / "pool", cluster, cfg.workers, log),
    )
    shard_dirs = {}
    exported = {}
    for spec in (cfg.low, cfg.high):
        d = out / "shards" / str(spec.side)
        exported[spec.side] = runner.run(
            f"export-{spec.side}",
            f"export {spec.side}px Parquet shards",
            lambda d=d, spec=spec: curation.export_stage(
                cluster, labels, d, spec.side, spec.batch_size, log
            ),
        )
        shard_dirs[spec.side] = str(d)
    job = training.job_config(cfg, out, shard_dirs, prompts[:8])
    pretrained = runner.run(
        "pretrain",
        "pretrain the tiny DiT at the low, then the high resolution",
        lambda: training.pretrain(job),
    )

    def sample_all() -> dict:
        (out / "samples").mkdir(exist_ok=True)
        names = {}
        for name, index, trained in (
            ("untrained", 0, False),
            (f"after {job.stages[0].name}", 0, True),
            (f"after {job.stages[1].name}", 1, True),
        ):
            images = evaluation.sample(
                job, index, trained, prompts, cfg.eval.seeds, cfg.eval.steps, cfg.eval.cfg
            )
            np.save(out / "samples" / f"{name}.npy", images)
            names[name] = list(images.shape)
        return names

    sampled = runner.run("sample", "sample held-out prompts with fixed seeds", sample_all)
    scores = runner.run(
        "score",
        "score the samples with the rubric verifier (ShapesEval)",
        lambda: {
            name: evaluation.shapes_eval(np.load(out / "samples" / f"{name}.npy"), held_out)
            for name in sampled
        },
    )
    results = {
        "pool": pool,
        "curate": curated,
        "export": exported,
        "pretrain": pretrained,
        "score": scores,
    }
    timings = [(r.name, r.seconds) for r in runner.records]
    summary = runner.run(
        "report",
        "write report.html and summary.json",
        lambda: report.write_report(out, results, timings),
    )
    for name, e in scores.items():
        typer.echo(f"ShapesEval {name:<22} {e['shapes_eval']:.3f}  {e['by_kind']}")
    return summary
