"""Run a trainer job with an RL objective: the one launch both preference optimization and
GRPO/DiffusionNFT use (logging to the run directory, the configs saved by the main rank,
the process group torn down with a barrier only after a clean finish)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from krea2.trainer import JobConfig

__all__ = ["named_objective", "run_with_objective", "world_size"]


def world_size() -> int:
    """Ranks of this launch (torchrun's ``WORLD_SIZE``; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def named_objective(job: JobConfig, name: str, settings: Any) -> JobConfig:
    """``job`` with every stage not yet finished in its run directory naming objective
    ``name`` and ``settings`` (its config dataclass): the saved ``config.toml`` then says
    what trained them, and ``krea2 train --config`` on it trains the same way."""
    from dataclasses import replace

    from krea2.infra.config import config_to_dict

    done = Path(job.run_dir) / "checkpoints"
    plain = config_to_dict(settings)
    stages = [
        s
        if (done / f"{s.name}.done").exists()
        else replace(s, objective=name, settings=dict(plain), spike_guard=False)
        for s in job.stages
    ]
    return replace(job, stages=stages)


def run_with_objective(
    job: JobConfig, objective: Any, resume: bool, records: Mapping[str, Any]
) -> Path:
    """Train ``job`` with ``objective``; the main rank saves ``config.toml`` and each of
    ``records`` (file name -> config dataclass) in the run directory. Returns it."""
    from krea2.infra.config import save_config
    from krea2.infra.logging import setup_logging
    from krea2.trainer import Trainer, shutdown

    run_dir = Path(job.run_dir)
    setup_logging("INFO", file=run_dir / "train.log.jsonl")
    trainer = Trainer(job, resume=resume, objective=objective)
    if trainer.env.is_main:
        save_config(job, run_dir / "config.toml")
        for name, record in records.items():
            save_config(record, run_dir / name)
    finished = False
    try:
        trainer.run()
        finished = True
    finally:
        shutdown(synchronize=finished)
    return run_dir
