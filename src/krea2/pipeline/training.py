"""Demo stage 5: pretrain the tiny DiT on the exported shards, one resolution after another."""

from __future__ import annotations

from pathlib import Path

from krea2.trainer import JobConfig, Trainer, read_metrics


def pretrain(job: JobConfig) -> dict:
    """Run (or resume) every stage of ``job`` (its ``config.toml`` saved in the run, so the
    run can be continued and sampled like any ``krea2 train`` run); returns the loss curve
    of each stage."""
    from krea2.infra import save_config

    save_config(job, Path(job.run_dir) / "config.toml")
    Trainer(job, resume=True).run()
    return {"curves": loss_curves(Path(job.run_dir))}


def loss_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Per stage, (step, training loss) pairs, averaged over windows of ~20 steps."""
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
