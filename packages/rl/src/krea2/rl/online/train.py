"""Run an RL stage (GRPO or DiffusionNFT) on the trainer: the job, the run config of
``krea2 rl grpo`` and the torchrun entry.

The RL stage is one more trainer stage after a pretrained one: it starts from that stage's
newest checkpoint (linked, never modified), trains on prompt shards with
:class:`~krea2.rl.online.objective.GrpoObjective`, and has everything else of the trainer:
FSDP2 over the ranks torchrun starts, checkpoints every ``checkpoint_every`` steps,
``resume`` to the exact step (the rollouts are seeded by step, so a resumed run redraws
the same ones), Prometheus metrics, progress and ``metrics.jsonl``.
Several ranks: ``torchrun --nproc-per-node 2 -m krea2.rl.online.train RUN_TOML [--set k=v]``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from krea2.infra.config import load_config
from krea2.infra.errors import UserError
from krea2.rl.online.config import GrpoConfig
from krea2.rl.online.objective import EvalHook
from krea2.rl.rewards import Reward
from krea2.trainer import IrepaConfig, JobConfig, LoraConfig, ScheduleConfig

RL_STAGE = "rl"


@dataclass
class RlRunConfig:
    """``krea2 rl grpo --config``: start from stage ``stage`` (None: the last one with a
    checkpoint) of the ``krea2 train`` run ``pretrained``, RL-train on the prompts of
    ``prompts_file`` (one per line) into ``run_dir``: ``steps`` iterations of
    ``prompts_per_step`` prompts (x ``grpo.group_size`` images) at ``lr`` (constant after
    ``warmup_steps``, decaying linearly to 0 over the last ``lr_decay_ratio`` of the
    steps), the result the EMA of the weights with ``ema_decay`` > 0 (per iteration), full
    fine-tuning or LoRA of rank ``lora_rank``, checkpoints every ``checkpoint_every`` steps
    (0: at the end); ``[grpo]`` is the objective (:class:`GrpoConfig`)."""

    pretrained: str = ""
    stage: str | None = None
    run_dir: str = "runs/grpo"
    prompts_file: str = ""
    steps: int = 100
    prompts_per_step: int = 8
    lr: float = 1e-5
    warmup_steps: int = 0
    lr_decay_ratio: float = 0.0
    ema_decay: float = 0.0
    lora_rank: int = 0
    checkpoint_every: int = 20
    log_every: int = 1
    grpo: GrpoConfig = field(default_factory=GrpoConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.checkpoint_every < 0:
            raise ValueError(
                f"checkpoint_every={self.checkpoint_every} must be >= 0 (0: at the end)"
            )
        if not 0 <= self.lr_decay_ratio <= 1:
            raise ValueError(f"lr_decay_ratio={self.lr_decay_ratio} must be in [0, 1]")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay={self.ema_decay} must be in [0, 1)")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be positive")


def rl_job(
    pretrain: JobConfig,
    stage_index: int,
    run_dir: Path,
    shards: Path,
    steps: int,
    prompts_per_step: int,
    lr: float,
    warmup_steps: int = 0,
    lora_rank: int = 0,
    checkpoint_every: int = 20,
    log_every: int = 1,
    decay_ratio: float = 0.0,
    ema_decay: float = 0.0,
) -> JobConfig:
    """``pretrain``'s stages up to ``stage_index``, then stage ``rl`` on the prompt shards
    under ``shards`` (same resolution, patch and time shift; ``prompts_per_step`` prompts
    per step; lr constant after ``warmup_steps``, then decaying linearly to 0 over the last
    ``decay_ratio`` of the steps; the result the EMA of the weights with ``ema_decay`` > 0
    (``StageConfig.ema_decay``); the spike guard off: RL losses are not flow
    losses; LoRA of ``lora_rank`` or full fine-tuning). Link the pretrained stage with
    :func:`krea2.trainer.link_finished` before training."""
    if not 0 <= stage_index < len(pretrain.stages):
        raise UserError(
            f"stage_index={stage_index}: the pretraining job has {len(pretrain.stages)} stages"
        )
    from krea2.trainer import continuation_job

    stage = replace(
        pretrain.stages[stage_index], name=RL_STAGE, spike_guard=False,
        data=[f"{shards}/*.parquet"], eval_data=[], steps=steps,
        batch_size=prompts_per_step, lr=lr, caption_weights={"medium": 1.0},
        caption_dropout=0.0,
        schedule=ScheduleConfig(warmup_steps=min(warmup_steps, steps - 1),
                                decay_ratio=decay_ratio),
        ema_decay=ema_decay, irepa=IrepaConfig(), lora=LoraConfig(rank=lora_rank),
    )  # fmt: skip
    return continuation_job(
        pretrain, stage_index, stage, run_dir, checkpoint_every=checkpoint_every,
        log_every=log_every,
    )  # fmt: skip


def train_rl(
    job: JobConfig,
    gc: GrpoConfig,
    rewards: Mapping[str, Reward],
    resume: bool = False,
    evaluate: EvalHook | None = None,
    eval_every: int = 0,
) -> Path:
    """Train ``job`` (its unfinished stages on prompt shards) with ``gc``'s objective and
    ``rewards``; returns the run directory. ``metrics.jsonl`` rows of kind ``train`` carry
    ``reward_<name>``, ``loss``, ``ratio_mean``, ``clip_fraction``, ``kl``,
    ``first_ratio_max_dev`` (GRPO), the times of rollout/reward/train and any ``eval_*``."""
    from krea2.rl.objective_run import named_objective, run_with_objective, world_size
    from krea2.rl.online.objective import GrpoObjective
    from krea2.trainer import validate_job

    validate_job(job, world_size())
    objective = GrpoObjective(gc, rewards, evaluate, eval_every)
    job = named_objective(job, gc.objective.value, gc)
    return run_with_objective(job, objective, resume, {"grpo.toml": gc})


def load_rewards(gc: GrpoConfig) -> dict[str, Reward]:
    """``gc.rewards``' specs loaded (``krea2.rl.rewards.load_reward``, plus ``smooth``:
    ``krea2.rl.preference.SmoothnessReward``, which ranks any model's samples); UserError
    naming a bad one."""
    from krea2.rl.rewards import load_reward

    out: dict[str, Reward] = {}
    for name, spec in gc.rewards.items():
        if spec == "smooth":
            from krea2.rl.preference import SmoothnessReward

            out[name] = SmoothnessReward()
            continue
        try:
            out[name] = load_reward(spec)
        except ValueError as exc:
            raise UserError(f"grpo.rewards.{name}: {exc}") from None
    return out


def run_from_config(path: str | Path | None, overrides: Sequence[str], resume: bool) -> Path:
    """``krea2 rl grpo``: build the RL job of an :class:`RlRunConfig` file (prompt shards
    written once under ``run_dir/prompts``) and train it."""
    from krea2.rl.online.prompts import export_prompt_shards
    from krea2.trainer import link_finished, load_job

    try:
        rc = load_config(RlRunConfig, path, overrides)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not rc.pretrained:
        raise UserError("set pretrained = the krea2 train run directory RL starts from")
    source = Path(rc.pretrained)
    if not (source / "config.toml").is_file():
        raise UserError(f"{source} has no config.toml; point pretrained at a krea2 train run")
    prompts_path = Path(rc.prompts_file)
    if not rc.prompts_file or not prompts_path.is_file():
        raise UserError(f"prompts_file={rc.prompts_file!r} is not a file of prompts (one a line)")
    prompts = [ln.strip() for ln in prompts_path.read_text().splitlines() if ln.strip()]
    pretrain = load_job(source / "config.toml")
    pretrain.run_dir = source
    index = _stage_index(pretrain, rc.stage)
    run_dir = Path(rc.run_dir)
    shards = run_dir / "prompts"
    if not any(shards.glob("*.parquet")):
        side = pretrain.stages[index].resolution
        export_prompt_shards(prompts, shards, side, rc.prompts_per_step)
    job = rl_job(pretrain, index, run_dir, shards, rc.steps, rc.prompts_per_step, rc.lr,
                 rc.warmup_steps, rc.lora_rank, rc.checkpoint_every, rc.log_every,
                 rc.lr_decay_ratio, rc.ema_decay)  # fmt: skip
    if not resume and list((run_dir / "checkpoints" / RL_STAGE).glob("step-*")):
        raise UserError(
            f"{run_dir} already holds RL checkpoints; pass --resume to continue it or choose "
            "another run_dir"
        )
    link_finished(pretrain, index, run_dir)
    # resume=True always: the linked pretrained checkpoints are not this run's to refuse
    return train_rl(job, rc.grpo, load_rewards(rc.grpo), resume=True)


def _stage_index(job: JobConfig, name: str | None) -> int:
    """The index of stage ``name`` (None: the last) of ``job``; UserError naming the
    stages when there is none of that name."""
    names = [s.name for s in job.stages]
    if name is None:
        return len(names) - 1
    if name not in names:
        raise UserError(f"stage {name!r} is not a stage of {job.run_dir}; its stages: {names}")
    return names.index(name)


def main(argv: Sequence[str]) -> int:
    """``python -m krea2.rl.online.train RUN_TOML [--resume] [--set key=value ...]``: the
    entry each torchrun rank runs."""
    args = list(argv)
    resume = "--resume" in args
    args = [a for a in args if a != "--resume"]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    plain = [a for i, a in enumerate(args) if a != "--set" and (i == 0 or args[i - 1] != "--set")]
    if len(plain) != 1:
        print(main.__doc__, file=sys.stderr)
        return 2
    try:
        run_from_config(plain[0], sets, resume)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
