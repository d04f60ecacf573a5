"""Training metrics: JSON lines on rank 0, Prometheus gauges on every rank, MFU."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from krea2.infra import metrics
from krea2.infra.logging import get_logger

log = get_logger("trainer")

_GAUGES = {
    "loss": "training loss of the last step (global weighted mean)",
    "grad_norm": "global gradient norm before clipping",
    "lr": "learning rate of the first parameter group",
    "step": "last finished training step",
    "samples_per_second": "training samples per second, all ranks",
    "tokens_per_second": "image tokens per second, all ranks",
    "mfu": "model FLOPs utilisation (dit FLOP counter / configured peak)",
    "eval_loss": "held-out flow loss at fixed times and noise",
}


def mfu(train_flops: float, step_seconds: float, world: int, peak_tflops: float) -> float | None:
    """Achieved FLOP/s over the peak of ``world`` devices; None without a configured peak."""
    if peak_tflops <= 0 or step_seconds <= 0:
        return None
    return train_flops / step_seconds / (world * peak_tflops * 1e12)


class MetricsLog:
    """Appends one JSON object per record to ``run_dir/metrics.jsonl`` (rank 0 only) and sets
    the ``krea2_trainer_*`` gauges (labelled by stage)."""

    def __init__(self, path: Path, write: bool, tracker: Any = None) -> None:
        self.path = path
        self.write = write
        # a krea2.infra.tracking Tracker (rank 0) that gets the same rows; None: none
        self.tracker = tracker
        self._gauges = {
            name: metrics.gauge("trainer", name, doc, labelnames=("stage",))
            for name, doc in _GAUGES.items()
        }
        self.skipped = metrics.counter(
            "trainer", "skipped_steps_total", "steps whose update was dropped", ("stage", "reason")
        )
        self.bad_samples = metrics.counter(
            "trainer", "bad_samples_total", "undecodable samples skipped", ("stage",)
        )
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, kind: str, stage: str, values: dict[str, Any]) -> None:
        for name, value in values.items():
            gauge = self._gauges.get(name)
            if gauge is not None and isinstance(value, int | float) and math.isfinite(value):
                gauge.labels(stage=stage).set(value)
        if not self.write:
            return
        row = {"kind": kind, "stage": stage, "time": round(time.time(), 3), **values}
        with self.path.open("a") as f:
            f.write(json.dumps(row, allow_nan=True) + "\n")
        if self.tracker is not None and "step" in values:
            step = int(values["step"])
            numbers = {k: v for k, v in values.items() if k != "step"}
            self.tracker.log_scalars(step, numbers, prefix=f"{stage}/{kind}")
            if "path" in values and str(values["path"]).endswith(".png"):
                tag = f"{stage}/{kind}/{values.get('name', 'grid')}"
                self.tracker.log_image(step, tag, Path(values["path"]))

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()


def open_run_tracker(cfg: Any, run_dir: Path):
    """The job's experiment tracker (``observe.tracker``; None for "none"), given the
    resolved config; open it on rank 0 only."""
    obs = cfg.observe
    if obs.tracker == "none":
        return None
    from krea2.infra.config import config_to_dict
    from krea2.infra.tracking import open_tracker

    name = obs.tracker_name or Path(run_dir).name
    tracker = open_tracker(obs.tracker, Path(run_dir), obs.tracker_project, name, obs.tracker_uri)
    tracker.log_config(config_to_dict(cfg))
    return tracker


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; for steps logged twice (replayed after a resume or
    rollback) the last row wins, and rows keep step order."""
    rows: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a kill
        rows[(row.get("kind"), row.get("stage"), row.get("step"))] = row
    return list(rows.values())
