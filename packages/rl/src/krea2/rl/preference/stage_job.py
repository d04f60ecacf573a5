"""The trainer job of a preference stage: the pretraining job with one more stage that
starts from a pretrained stage's newest checkpoint and trains on pair shards."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.trainer import IrepaConfig, JobConfig, ScheduleConfig

PREFERENCE_STAGE = "preference"


def preference_job(
    pretrain: JobConfig,
    stage_index: int,
    run_dir: Path,
    shards: Path,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int = 10,
    log_every: int = 5,
    checkpoint_every: int = 50,
) -> JobConfig:
    """``pretrain``'s stages up to ``stage_index``, then a stage named ``preference`` with
    the same resolution, patch and time shift on the pair shards under ``shards``: no
    caption dropout, the medium caption (the prompt), a constant lr after ``warmup_steps``,
    no spike guard (a preference loss falls by design), and ``init_from = "previous"``.

    The earlier stages are not run again: :func:`link_pretrained` marks them finished in
    ``run_dir`` and links the pretrained stage's checkpoints there, so the trainer's own
    warm start (with the stage's patch) loads the policy and the frozen reference."""
    if not 0 <= stage_index < len(pretrain.stages):
        raise UserError(
            f"stage_index={stage_index}: the pretraining job has {len(pretrain.stages)} stages"
        )
    base = pretrain.stages[stage_index]
    stage = replace(
        base,
        name=PREFERENCE_STAGE,
        data=[f"{shards}/*.parquet"],
        eval_data=[],
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        caption_weights={"medium": 1.0},
        caption_dropout=0.0,
        schedule=ScheduleConfig(warmup_steps=min(warmup_steps, steps - 1), decay_ratio=0.0),
        irepa=IrepaConfig(),
        init_from="previous",
    )
    return replace(
        pretrain,
        run_dir=Path(run_dir),
        stages=[*pretrain.stages[: stage_index + 1], stage],
        checkpoint=replace(pretrain.checkpoint, every=checkpoint_every, keep_last=2),
        stability=replace(pretrain.stability, warmup_steps=10**9),
        observe=replace(
            pretrain.observe, log_every=log_every, sample_prompts=[], eval_every=0, sample_every=0
        ),
    )


def link_pretrained(pretrain: JobConfig, stage_index: int, run_dir: Path) -> None:
    """Mark ``pretrain``'s stages up to ``stage_index`` finished under ``run_dir`` and link
    the last one's checkpoint directory there (read only: the stage is never run again).
    UserError when that stage has not finished pretraining."""
    source = Path(pretrain.run_dir) / "checkpoints"
    name = pretrain.stages[stage_index].name
    if not (source / f"{name}.done").exists():
        raise UserError(
            f"stage {name!r} of {pretrain.run_dir} has not finished pretraining "
            f"({source / (name + '.done')} is missing); pretrain it first"
        )
    target = Path(run_dir) / "checkpoints"
    target.mkdir(parents=True, exist_ok=True)
    for stage in pretrain.stages[: stage_index + 1]:
        (target / f"{stage.name}.done").write_text(f"{stage.steps}\n")
    link = target / name
    if not link.exists():
        os.symlink((source / name).resolve(), link, target_is_directory=True)
