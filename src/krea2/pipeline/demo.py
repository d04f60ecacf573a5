"""The toy pipeline's driver: each stage resumes from its record under ``--out``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import typer

from krea2.infra import UserError
from krea2.infra.progress import progress
from krea2.pipeline.config import DemoConfig, load_demo_config, smoke_note, training_job
from krea2.pipeline.stages import StageRunner, StoppedAfter

CHAIN_STAGE = "chain"


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
    """The demo's stages in the order they run (export stages follow the recipe's
    training resolutions)."""
    from krea2.pipeline import expander_stage, preference, rl_stage, sft_merge

    exports = [f"export-{s.resolution}" for s in cfg.train.stages]
    tuned = [preference.stage_name(kind) for kind in preference.OBJECTIVES]
    tuned.append(rl_stage.STAGE)  # RL without CFG continues the chain from STPO: raw
    tuned.append(CHAIN_STAGE)  # every chain model measured alike
    tuned.append(expander_stage.STAGE)  # the prompt expander goes in front of raw last
    trained = ["pretrain", "sample", "score", sft_merge.STAGE]
    return ["shards", "pool", "curate", *exports, *trained, *tuned, "report"]


def _stages(runner: StageRunner, cfg: DemoConfig, out: Path) -> dict:
    from krea2.curate.shapes import concept_scene, eval_prompt
    from krea2.pipeline import curation, evaluation, preference, report, sft_merge, training
    from krea2.pipeline.pool import build_pool

    log = out / "commands.log"
    split, held_out = evaluation.demo_concepts(cfg)
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
    curated = runner.run(
        "curate",
        f"ingest, curate and caption with {cfg.workers} worker processes per job",
        lambda: curation.curate_pool(out / "pool", cluster, cfg.workers, log, cfg.curate),
    )
    shard_dirs = []
    exported = {}
    for stage in cfg.train.stages:
        side, d = stage.resolution, out / "shards" / stage.name
        exported[side] = runner.run(
            f"export-{side}",
            f"export {side}px Parquet shards for {stage.name}",
            lambda d=d, side=side, batch=stage.batch_size: curation.export_stage(
                cluster, d, side, batch, log
            ),
        )
        shard_dirs.append(d)
    job = training_job(cfg, out / "run", shard_dirs, prompts[:8])
    pretrained = runner.run(
        "pretrain",
        "pretrain the tiny DiT at each resolution in turn",
        lambda: training.pretrain(job),
    )

    def sample_all() -> dict:
        (out / "samples").mkdir(exist_ok=True)
        names = {}
        checkpoints = [("untrained", 0, False)]
        checkpoints += [(f"after {s.name}", i, True) for i, s in enumerate(job.stages)]
        total = len(checkpoints) * cfg.eval.steps * len(cfg.eval.seeds)
        with progress("sample", total, unit="step") as bar:
            for name, index, trained in checkpoints:
                images = evaluation.sample(
                    job,
                    index,
                    trained,
                    prompts,
                    cfg.eval.seeds,
                    cfg.eval.steps,
                    cfg.eval.cfg,
                    on_step=bar.advance,
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
    # The chain: pretrained -> SFT (the recipe's merge) -> PO (STPO) -> RL (raw); DPO is a
    # branch from the SFT model on the same pairs and feeds nothing.
    from krea2.pipeline import chain, expander_stage, rl_stage

    pretrained_model = chain.model_record(job, len(job.stages) - 1)
    merged = runner.run(
        sft_merge.STAGE,
        sft_merge.WHAT,
        lambda: sft_merge.run_demo_stage(cfg, job, out / "sft-merge", split.train, held_out),
    )
    sft_job, _ = chain.load_model(merged["model"])
    tuned = {
        kind: runner.run(
            preference.stage_name(kind),
            what,
            lambda kind=kind: preference.run_objective(
                cfg, sft_job, out / "preference", kind, list(split.train), held_out
            ),
        )
        for kind, what in preference.OBJECTIVES.items()
    }
    po_job, _ = chain.load_model(tuned["stpo"]["model"])
    rl = runner.run(
        rl_stage.STAGE,
        rl_stage.WHAT,
        lambda: rl_stage.run_demo_stage(cfg, po_job, out / "rl", list(split.train), held_out),
    )
    models = {"pretrained": pretrained_model, "sft": merged["model"],
              "po": tuned["stpo"]["model"], "raw": rl["model"]}  # fmt: skip
    last = job.stages[-1].name
    measured = runner.run(
        CHAIN_STAGE,
        "measure every chain model alike, with and without CFG",
        lambda: chain.measure_chain(
            models, out / "chain", prompts, [concept_scene(c) for c in held_out],
            list(cfg.eval.seeds), cfg.eval.steps, cfg.eval.cfg,
            cached={"pretrained-cfg": out / "samples" / f"after {last}.npy"},
        ),
    )  # fmt: skip
    raw = chain.load_model(rl["model"])
    expanded = runner.run(
        expander_stage.STAGE,
        expander_stage.WHAT,
        lambda: expander_stage.run_demo_stage(
            cfg, job, out / "expander", held_out, model=raw, cfg_scale=0.0
        ),
    )
    results = {
        "chain": measured,
        "pool": pool,
        "curate": curated,
        "export": exported,
        "pretrain": pretrained,
        "score": scores,
        "preference": tuned,
        "rl": rl,
        "sft_merge": merged,
        "expander": expanded,
    }
    timings = [(r.name, r.seconds) for r in runner.records]
    summary = runner.run(
        "report",
        "write report.html and summary.json",
        lambda: report.write_report(out, results, timings, smoke_note(cfg)),
    )
    for name, e in scores.items():
        typer.echo(f"ShapesEval {name:<22} {e['shapes_eval']:.3f}  {e['by_kind']}")
    for line in chain.verdicts(measured):
        typer.echo(f"chain: {line}")
    for kind, r in tuned.items():
        typer.echo(preference.summary_line(kind, r))
    typer.echo(rl_stage.summary_line(rl))
    typer.echo(expander_stage.summary_line(expanded))
    if note := smoke_note(cfg):
        typer.secho(note, fg="yellow")
    return summary
