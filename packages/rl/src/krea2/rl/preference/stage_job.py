"""The trainer job of a preference stage: the pretraining job with one more stage that
starts from a pretrained stage's newest checkpoint and trains on pair shards."""

from __future__ import annotations

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
    caption_dropout: float = 0.0,
) -> JobConfig:
    """``pretrain``'s stages up to ``stage_index``, then a stage named ``preference`` with
    the same resolution, patch and time shift on the pair shards under ``shards``: the
    medium caption (the prompt), dropped for a pair with probability ``caption_dropout``
    (the objective then trains the unconditional branch too), a constant lr after
    ``warmup_steps``, the spike guard off (a preference loss falls by design).

    The earlier stages are not run again: :func:`krea2.trainer.link_finished` marks them finished in
    ``run_dir`` and links the pretrained stage's checkpoints there, so the trainer's own
    warm start (with the stage's patch) loads the policy and the frozen reference."""
    from krea2.trainer import continuation_job

    if not 0 <= stage_index < len(pretrain.stages):
        raise UserError(
            f"stage_index={stage_index}: the pretraining job has {len(pretrain.stages)} stages"
        )
    stage = replace(
        pretrain.stages[stage_index],
        name=PREFERENCE_STAGE,
        spike_guard=False,
        data=[f"{shards}/*.parquet"],
        eval_data=[],
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        caption_weights={"medium": 1.0},
        caption_dropout=caption_dropout,
        schedule=ScheduleConfig(warmup_steps=min(warmup_steps, steps - 1), decay_ratio=0.0),
        irepa=IrepaConfig(),
    )
    return continuation_job(
        pretrain, stage_index, stage, run_dir, checkpoint_every=checkpoint_every,
        log_every=log_every,
    )  # fmt: skip
