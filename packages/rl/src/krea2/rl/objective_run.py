"""Run a trainer job with an RL objective: the one launch both preference optimization and
GRPO/DiffusionNFT use (logging to the run directory, the configs saved by the main rank,
the process group torn down with a barrier only after a clean finish)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from krea2.trainer import JobConfig

__all__ = ["run_with_objective", "world_size"]


def world_size() -> int:
    """Ranks of this launch (torchrun's ``WORLD_SIZE``; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


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
