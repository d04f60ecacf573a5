"""Demo stage 5: pretrain the tiny DiT on the exported shards, one resolution after another."""

from __future__ import annotations

from pathlib import Path

from krea2.trainer import JobConfig, Trainer, read_metrics


def pretrain(job: JobConfig) -> dict:
    """Run (or resume) every stage of ``job``; returns the loss curve of each stage."""
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
