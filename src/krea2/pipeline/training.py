"""Demo stage 5: pretrain the tiny DiT on the exported shards, low then high resolution."""

from __future__ import annotations

from pathlib import Path

from krea2.pipeline.config import DemoConfig, StageSpec

# Medium captions name colour, shape and position, which is what ShapesEval asks for; the
# other formats keep the model readable from every caption style the exporter writes (the
# JSON caption's first 12 words name only the background, so it gets the least weight).
CAPTION_WEIGHTS = {"long": 0.15, "medium": 0.65, "short": 0.1, "tags": 0.05, "json": 0.05}


def stage_name(spec: StageSpec) -> str:
    return f"pretrain-{spec.side}"


def job_config(cfg: DemoConfig, out: Path, shard_dirs: dict[int, str], sample_prompts: list[str]):
    """The trainer's JobConfig for the two resolution stages."""
    from krea2.trainer.config import (
        CheckpointConfig,
        DataConfig,
        JobConfig,
        ModelConfig,
        ObserveConfig,
        OptimizerConfig,
        ParallelConfig,
        ScheduleConfig,
        StageConfig,
        TextConfig,
    )

    stages = []
    for spec in (cfg.low, cfg.high):
        stages.append(
            StageConfig(
                name=stage_name(spec),
                data=[f"{shard_dirs[spec.side]}/shard-*.parquet"],
                resolution=spec.side,
                steps=spec.steps,
                batch_size=spec.batch_size,
                lr=spec.lr,
                time_shift=spec.time_shift,
                patch=spec.patch,
                caption_weights=dict(CAPTION_WEIGHTS),
                schedule=ScheduleConfig(warmup_steps=min(50, spec.steps // 5), decay_ratio=0.2),
            )
        )
    return JobConfig(
        run_dir=out / "run",
        seed=cfg.pool.seed,
        model=ModelConfig(
            name=cfg.model,
            overrides=dict(cfg.model_overrides),
            autocast=cfg.autocast,
            prediction=cfg.prediction,
        ),
        text=TextConfig(max_tokens=cfg.text_tokens),
        optimizer=OptimizerConfig(lr=cfg.low.lr),
        parallel=ParallelConfig(threads=cfg.threads),
        # Decoding 64 toy PNGs takes milliseconds; a worker process costs ~6 s to start.
        data=DataConfig(workers=0),
        checkpoint=CheckpointConfig(every=max(50, cfg.low.steps // 4), keep_last=2),
        observe=ObserveConfig(
            sample_prompts=sample_prompts,
            sample_seeds=[0],
            sample_steps=cfg.eval.steps,
            sample_cfg=cfg.eval.cfg,
        ),
        stages=stages,
    )


def pretrain(job) -> dict:
    """Run (or resume) both stages; returns the loss curve of each stage."""
    from krea2.trainer.trainer import Trainer

    Trainer(job, resume=True).run()
    return {"curves": loss_curves(Path(job.run_dir))}


def loss_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Per stage, (step, training loss) pairs, averaged over windows of ~20 steps."""
    from krea2.trainer.observe import read_metrics

    by_stage: dict[str, list[tuple[int, float]]] = {}
    for row in read_metrics(run_dir / "metrics.jsonl"):
        if row.get("kind") == "train" and isinstance(row.get("loss"), int | float):
            by_stage.setdefault(row["stage"], []).append((row["step"], float(row["loss"])))
    smooth = {}
    for stage, points in by_stage.items():
        points.sort()
        window = max(1, len(points) // 50)
        smooth[stage] = [
            (points[i][0], sum(p[1] for p in points[i : i + window]) / len(points[i : i + window]))
            for i in range(0, len(points), window)
        ]
    return smooth
