"""A style-reference stage after a finished stage of another run: the job and its run.

The stage starts from the source stage's newest checkpoint (linked, never modified; it is
the frozen base), trains only the style module on image shards (objective ``style``,
:class:`~krea2.trainer.style_ref.StyleSettings` in its settings table) and has the rest
of the trainer: FSDP2, checkpoints, exact resume, metrics. ``krea2 train --config`` on the
saved ``config.toml`` trains the same way; this module is what a recipe calls from Python.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.trainer.config import IrepaConfig, JobConfig, LoraConfig, ScheduleConfig
from krea2.trainer.style_settings import STYLE_OBJECTIVE, StyleSettings


def style_job(
    source: JobConfig,
    stage_index: int,
    run_dir: str | Path,
    shards: str | Path,
    settings: StyleSettings,
    steps: int,
    batch_size: int,
    lr: float,
    checkpoint_every: int = 0,
    keep_last: int = 2,
    name: str = "style",
    caption_weights: dict[str, float] | None = None,
    caption_dropout: float = 0.0,
) -> JobConfig:
    """``source``'s stages up to ``stage_index``, then stage ``name`` training a style
    module with ``settings`` on the image shards under ``shards`` (a ``reference`` column
    when ``settings.reference`` is ``paired``): ``steps`` steps of ``batch_size`` images at
    ``lr`` (constant after no warmup), captions drawn by ``caption_weights`` (None: the
    ``medium`` one) and dropped at ``caption_dropout``, no LoRA, EMA or iREPA; checkpoints
    every ``checkpoint_every`` steps (0: at the end), the newest ``keep_last`` kept.
    :func:`train_style` links and trains it."""
    if not 0 <= stage_index < len(source.stages):
        raise UserError(f"stage_index={stage_index}: the source job has {len(source.stages)}")
    if steps < 1 or batch_size < 1 or not lr > 0:
        raise UserError(f"steps={steps}, batch_size={batch_size} must be >= 1, lr={lr} > 0")
    from krea2.infra.config import config_to_dict
    from krea2.trainer.continuation import continuation_job

    stage = replace(
        source.stages[stage_index], name=name, objective=STYLE_OBJECTIVE,
        settings=config_to_dict(settings), data=[f"{shards}/*.parquet"], eval_data=[],
        steps=steps, batch_size=batch_size, lr=lr,
        caption_weights=dict(caption_weights or {"medium": 1.0}),
        caption_dropout=caption_dropout, schedule=ScheduleConfig(warmup_steps=0), ema_decay=0.0,
        irepa=IrepaConfig(), lora=LoraConfig(),
    )  # fmt: skip
    return continuation_job(source, stage_index, stage, run_dir,
                            checkpoint_every=checkpoint_every, keep_last=keep_last)  # fmt: skip


def train_style(source: JobConfig, stage_index: int, job: JobConfig) -> Path:
    """Link ``source``'s stage ``stage_index`` into ``job``'s run and train ``job`` (a
    :func:`style_job`), resuming from its newest checkpoint; returns the path of the
    stage's ``style.safetensors``. A finished run returns at once."""
    from krea2.infra.config import save_config
    from krea2.infra.logging import setup_logging
    from krea2.trainer.continuation import link_finished
    from krea2.trainer.distributed import shutdown, world_size
    from krea2.trainer.style_export import stage_style_path
    from krea2.trainer.trainer import Trainer
    from krea2.trainer.validate import validate_job

    run_dir = Path(job.run_dir)
    out = stage_style_path(run_dir, job.stages[-1].name)
    if (run_dir / "checkpoints" / f"{job.stages[-1].name}.done").exists() and out.exists():
        return out
    validate_job(job, world_size())
    link_finished(source, stage_index, run_dir)
    setup_logging("INFO", file=run_dir / "train.log.jsonl")
    # resume=True always: the linked source checkpoints are not this run's to refuse
    trainer = Trainer(job, resume=True)
    if trainer.env.is_main:
        save_config(job, run_dir / "config.toml")
    finished = False
    try:
        trainer.run()
        finished = True
    finally:
        shutdown(synchronize=finished)
    return out


__all__ = ["style_job", "train_style"]
