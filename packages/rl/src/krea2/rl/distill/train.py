"""A distillation stage after a finished one: the job and the in-process run.

Like the RL stage, the ``turbo`` stage is one more trainer stage: it starts from the
teacher stage's newest checkpoint (linked, never modified; the teacher is the stage's
frozen start), trains on prompt shards (:func:`krea2.rl.online.export_prompt_shards`)
with the registered objective ``tdm`` or ``dmd2`` (:class:`~krea2.rl.distill.TdmConfig`
in its settings table), and has everything else of the trainer: FSDP2, checkpoints,
exact resume, metrics. ``krea2 train --config`` on the saved ``config.toml`` trains the
same way; this module is what a recipe calls from Python.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.rl.distill.config import TdmConfig
from krea2.trainer import IrepaConfig, JobConfig, LoraConfig, ScheduleConfig

TURBO_STAGE = "turbo"


def distill_job(
    teacher: JobConfig,
    stage_index: int,
    run_dir: Path,
    shards: Path,
    settings: TdmConfig,
    steps: int,
    prompts_per_step: int,
    lr: float,
    checkpoint_every: int = 50,
    name: str = TURBO_STAGE,
    keep_last: int = 2,
) -> JobConfig:
    """``teacher``'s stages up to ``stage_index``, then stage ``name`` distilling it with
    ``settings`` (objective ``settings.mode``: ``tdm`` or ``dmd2``) on the prompt shards
    under ``shards``: ``steps`` iterations of ``prompts_per_step`` prompts at ``lr``
    (constant, no warmup), the whole student trained (no LoRA, no EMA, no iREPA), the spike
    guard off (distillation losses are not flow losses), checkpoints every
    ``checkpoint_every`` steps (0: at the end), the newest ``keep_last`` kept. Link the
    teacher stage with :func:`krea2.trainer.link_finished` before training
    (:func:`train_distill` does)."""
    if not 0 <= stage_index < len(teacher.stages):
        raise UserError(
            f"stage_index={stage_index}: the teacher's job has {len(teacher.stages)} stages"
        )
    if steps < 1 or prompts_per_step < 1 or not lr > 0:
        raise UserError(
            f"steps={steps}, prompts_per_step={prompts_per_step} must be at least 1 and "
            f"lr={lr} positive"
        )
    from krea2.infra.config import config_to_dict
    from krea2.trainer import continuation_job

    stage = replace(
        teacher.stages[stage_index], name=name, objective=settings.mode.value,
        settings=config_to_dict(settings), spike_guard=False,
        data=[f"{shards}/*.parquet"], eval_data=[], steps=steps,
        batch_size=prompts_per_step, lr=lr, caption_weights={"medium": 1.0},
        caption_dropout=0.0, schedule=ScheduleConfig(warmup_steps=0),
        ema_decay=0.0, irepa=IrepaConfig(), lora=LoraConfig(),
    )  # fmt: skip
    return continuation_job(teacher, stage_index, stage, run_dir,
                            checkpoint_every=checkpoint_every, keep_last=keep_last)  # fmt: skip


def train_distill(teacher: JobConfig, stage_index: int, job: JobConfig) -> Path:
    """Link ``teacher``'s stage ``stage_index`` into ``job``'s run and train ``job`` (a
    :func:`distill_job`), resuming from its newest checkpoint; returns the run directory.
    A finished run returns at once."""
    from krea2.rl.objective_run import run_with_objective, world_size
    from krea2.trainer import link_finished, validate_job

    run_dir = Path(job.run_dir)
    if (run_dir / "checkpoints" / f"{job.stages[-1].name}.done").exists():
        return run_dir
    validate_job(job, world_size())
    link_finished(teacher, stage_index, run_dir)
    # resume=True always: the linked teacher checkpoints are not this run's to refuse
    return run_with_objective(job, None, True, {})
