"""Paths a run records are absolute, so the run works from any directory.

A job written with paths relative to where it was started (``init_from = "tiny-model"``,
``encoder = "qwen3-vl:tiny-model/text_encoder"``, ``data = ["shards/*.parquet"]``) would
break ``krea2 train sample RUN`` or ``--resume`` run from elsewhere. :func:`absolute_paths`
resolves every component path, data glob and start point against the directory the job
is loaded from, before anything is saved.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from krea2.trainer.config import JobConfig, StageConfig

__all__ = ["absolute_paths"]

_KEYWORDS = ("previous", "none")


def _path(value: str, base: Path) -> str:
    return value if os.path.isabs(value) else os.path.normpath(base / value)


def _existing(value: str, base: Path) -> str:
    """``value`` made absolute when it names something that exists under ``base`` (else
    unchanged: not a path, or missing, which the preflight reports as the user wrote it)."""
    return _path(value, base) if (base / value).exists() else value


def _spec(value: str, base: Path) -> str:
    """``kind:PATH`` with PATH absolute (a spec without a path, or whose argument is not a
    path there, such as ``pixel:2``, unchanged)."""
    kind, sep, arg = value.partition(":")
    return f"{kind}{sep}{_existing(arg, base)}" if sep and arg else value


def _stage(stage: StageConfig, base: Path) -> StageConfig:
    init = stage.init_from if stage.init_from in _KEYWORDS else _existing(stage.init_from, base)
    return replace(
        stage,
        data=[_path(p, base) for p in stage.data],
        eval_data=[_path(p, base) for p in stage.eval_data],
        init_from=init,
    )


def absolute_paths(job: JobConfig, base: str | Path | None = None) -> JobConfig:
    """``job`` with its run directory, stages' data, held-out data and ``init_from``, the
    text encoder's and autoencoder's paths and the second validation base made absolute
    against ``base`` (None: the current directory)."""
    root = Path(base) if base is not None else Path.cwd()
    text = job.text
    text = replace(
        text,
        encoder=_spec(text.encoder, root),
        path=Path(_existing(str(text.path), root)) if text.path is not None else None,
    )
    model = replace(job.model, autoencoder=_spec(job.model.autoencoder, root))
    observe = job.observe
    if observe.second_base:
        observe = replace(observe, second_base=_existing(observe.second_base, root))
    return replace(
        job,
        run_dir=Path(_path(str(job.run_dir), root)),
        text=text,
        model=model,
        observe=observe,
        stages=[_stage(s, root) for s in job.stages],
    )
