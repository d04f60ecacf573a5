"""Continuing a finished run with one more stage, in a run directory of its own.

Post-training commands (``krea2 rl dpo``, ``krea2 rl grpo``, the demo's SFT, PO and RL
stages) train one stage that starts where a finished run's stage ended, without touching
that run: :func:`continuation_job` is the job (the source's stages up to the one to
continue, then the new stage with ``init_from = "previous"``), :func:`link_finished` marks
those stages finished in the new run directory and links the continued stage's
checkpoints there (read only), so the trainer's own warm start loads the policy, and the
frozen reference of an objective that needs one, exactly as in a single chained job.
:func:`adopt_weights` makes weights that no training stage wrote (a merge of several
fine-tunes, a released model) a finished stage of a run, so they continue the same way.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.trainer.config import JobConfig, StageConfig

__all__ = ["adopt_weights", "continuation_job", "link_finished"]


def continuation_job(
    source: JobConfig,
    index: int,
    stage: StageConfig,
    run_dir: str | Path,
    checkpoint_every: int | None = None,
    keep_last: int = 2,
    log_every: int | None = None,
    tracker: str | None = None,
) -> JobConfig:
    """``source``'s stages up to ``index``, then ``stage`` (its ``init_from`` set to
    ``previous``), run in ``run_dir``: checkpoints every ``checkpoint_every`` steps (None:
    the source's; 0: at the end) keeping ``keep_last``, metrics every ``log_every`` steps
    (None: the source's), no periodic samples or evaluations (the caller measures), the
    ``tracker`` given (None: the source's). UserError when ``index`` is not a stage of
    ``source`` or ``stage`` reuses one of the earlier stages' names."""
    if not 0 <= index < len(source.stages):
        raise UserError(f"stage index {index}: {source.run_dir} has {len(source.stages)} stages")
    earlier = source.stages[: index + 1]
    if stage.name in {s.name for s in earlier}:
        raise UserError(f"stage {stage.name!r} already names a stage of {source.run_dir}")
    every = source.checkpoint.every if checkpoint_every is None else checkpoint_every
    observe = replace(
        source.observe,
        log_every=source.observe.log_every if log_every is None else log_every,
        tracker=source.observe.tracker if tracker is None else tracker,
        sample_prompts=[],
        eval_every=0,
        sample_every=0,
    )
    return replace(
        source,
        run_dir=Path(run_dir),
        stages=[*earlier, replace(stage, init_from="previous")],
        checkpoint=replace(source.checkpoint, every=every, keep_last=keep_last),
        observe=observe,
    )


def link_finished(source: JobConfig, index: int, run_dir: str | Path) -> None:
    """Mark ``source``'s stages up to ``index`` finished under ``run_dir`` and link stage
    ``index``'s checkpoint directory there, with those of the stages before it that the
    source holds (a LoRA stage's adapters apply to the stage before it); never written:
    the stages are not run again.
    UserError when that stage of ``source`` has not finished."""
    checkpoints = Path(source.run_dir) / "checkpoints"
    name = source.stages[index].name
    if not (checkpoints / f"{name}.done").exists():
        raise UserError(
            f"stage {name!r} of {source.run_dir} has not finished "
            f"({checkpoints / (name + '.done')} is missing); train it first"
        )
    target = Path(run_dir) / "checkpoints"
    target.mkdir(parents=True, exist_ok=True)
    for stage in source.stages[: index + 1]:
        (target / f"{stage.name}.done").write_text(f"{stage.steps}\n")
    # Stage ``index`` and the stages before it whose checkpoints the source holds: a LoRA
    # stage's checkpoint is adapters only, read on top of the stage before it (and so on).
    for stage in source.stages[: index + 1]:
        link, held = target / stage.name, checkpoints / stage.name
        if link.is_dir() and not link.is_symlink() and not any(link.iterdir()):
            link.rmdir()  # left empty by an attempt that stopped before linking it
        if not link.exists() and (stage.name == name or held.is_dir()):
            os.symlink(held.resolve(), link, target_is_directory=True)


def adopt_weights(
    source: JobConfig, index: int, name: str, weights: str | Path, run_dir: str | Path
) -> JobConfig:
    """DiT weights from outside the run (a released-key ``.safetensors`` or a model folder,
    e.g. a merge of SFTs of stage ``index``) as stage ``name`` after stage ``index`` of
    ``source``, finished in ``run_dir``: its one checkpoint (step 0) holds stage
    ``index``'s result (text conditioning included) with the DiT replaced by ``weights``,
    at that stage's resolution and patch. Returns the job (the source's stages, then
    ``name``), ready for :func:`continuation_job`. Idempotent: a finished adoption is left
    as it is. UserError when the weights do not fit the model."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from krea2.dit.weights import read_checkpoint
    from krea2.infra.checkpoint import CheckpointManager
    from krea2.infra.config import save_config
    from krea2.trainer.build import build_module
    from krea2.trainer.config import IrepaConfig, LoraConfig
    from krea2.trainer.distributed import init_distributed
    from krea2.trainer.release_init import release_source
    from krea2.trainer.warmstart import stage_checkpoints, warm_start

    stage = replace(
        source.stages[index], name=name, init_from="previous", steps=1, objective="flow",
        settings={}, lora=LoraConfig(), irepa=IrepaConfig(), ema_decay=0.0, spike_guard=None,
    )  # fmt: skip
    job = replace(source, run_dir=Path(run_dir), stages=[*source.stages[: index + 1], stage])
    done = Path(run_dir) / "checkpoints" / f"{name}.done"
    if done.exists():
        return job
    link_finished(source, index, run_dir)
    env = init_distributed(job)
    module = build_module(job, stage, env)
    warm_start(job, index + 1, module, env.distributed)  # stage index's result, text and all
    state, _ = read_checkpoint(release_source(weights) or Path(weights))
    dtype = next(module.dit.parameters()).dtype
    try:
        module.dit.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    except RuntimeError as exc:
        raise UserError(f"{weights} does not fit stage {name!r}'s model: {exc}") from None
    mgr = CheckpointManager(stage_checkpoints(run_dir, name), keep_last=1)
    mgr.save(0, {"model": get_model_state_dict(module)}, {"step": 0, "adopted": str(weights)})
    save_config(job, Path(run_dir) / "config.toml")
    done.write_text("1\n")
    return job
