"""Run a preference-optimization job: a trainer job config whose stages train on pair
shards, with the preference objective in place of flow matching.

Everything else is the trainer's: FSDP2 over the ranks torchrun starts, checkpoints every
``checkpoint.every`` steps, ``resume`` to the exact step, metrics in ``metrics.jsonl``.
Several ranks: ``torchrun --nproc-per-node 2 -m krea2.rl.preference.train JOB PREF``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from krea2.infra.config import load_config
from krea2.infra.errors import UserError
from krea2.rl.preference.loss import PreferenceConfig
from krea2.trainer import JobConfig, StageConfig, load_job, validate_job


def check_pair_stage(stage: StageConfig, where: str, world: int) -> None:
    """What a preference stage needs beyond a trainer stage: pairs whole on every one of
    ``world`` data-parallel ranks (its ``caption_dropout`` drops a whole pair's prompt:
    :class:`~krea2.rl.preference.objective.PreferenceObjective`); UserError naming the
    stage (``where``: its key, e.g. ``stages.2``) and the fix."""
    if stage.batch_size % (2 * world):
        raise UserError(
            f"stage {stage.name!r}: batch_size={stage.batch_size} must be a multiple of "
            f"2 x {world} rank(s) (a batch row pair is a winner and its loser)"
        )


def check_preference_job(cfg: JobConfig, world: int) -> None:
    """:func:`check_pair_stage` for every stage of ``cfg`` not already finished in its run
    directory (e.g. the pretraining stages a preference stage starts after)."""
    done = Path(cfg.run_dir) / "checkpoints"
    for i, stage in enumerate(cfg.stages):
        if not (done / f"{stage.name}.done").exists():
            check_pair_stage(stage, f"stages.{i}", world)


def train_preference(
    job: str | Path | JobConfig,
    preference: PreferenceConfig,
    overrides: Sequence[str] = (),
    resume: bool = False,
) -> Path:
    """Train ``job`` (a trainer TOML or a :class:`JobConfig`) with ``preference``'s
    objective; returns the run directory (``metrics.jsonl`` rows of kind ``train`` carry
    ``winner_gap``, ``loser_gap``, ``margin``, ``accuracy``; ``preference.toml`` records
    the objective)."""
    from krea2.rl.objective_run import named_objective, run_with_objective, world_size
    from krea2.rl.preference.objective import PreferenceObjective

    cfg = job if isinstance(job, JobConfig) else load_job(job, overrides)
    trainer_world = world_size()
    validate_job(cfg, trainer_world)
    check_preference_job(cfg, trainer_world)
    objective = PreferenceObjective(preference)
    cfg = named_objective(cfg, preference.kind.value, preference)
    return run_with_objective(cfg, objective, resume, {"preference.toml": preference})


def main(argv: Sequence[str]) -> int:
    """``python -m krea2.rl.preference.train JOB_TOML PREFERENCE_TOML [--resume]
    [--set key=value ...]``: the entry each torchrun rank runs."""
    args = list(argv)
    resume = "--resume" in args
    args = [a for a in args if a != "--resume"]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    plain = [a for i, a in enumerate(args) if a != "--set" and (i == 0 or args[i - 1] != "--set")]
    if len(plain) != 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    try:
        train_preference(plain[0], load_config(PreferenceConfig, plain[1]), sets, resume)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
