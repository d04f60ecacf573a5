"""What a stage's checkpoint holds, and loading it back in place on a resume or rollback."""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from krea2.trainer.lora import checkpoint_options
from krea2.trainer.step import Objective, StageRun


def checkpoint_state(run: StageRun, objective: Objective | None) -> dict[str, Any]:
    """The trainable weights' state (a LoRA stage's frozen base is left out: it is its
    init_from, reloaded on resume), the optimizers', and the objective's own tensors when
    it keeps any (``objective.state(run)``, e.g. the RL old policy), and the stage's weight
    EMA when it keeps one. FSDP-aware: DTensors stay sharded, and a load fills these same
    tensors in place."""
    module = run.module
    state = {
        "model": get_model_state_dict(module, options=checkpoint_options(module)),
        "optim": get_optimizer_state_dict(module, run.optimizers),
    }
    objective_state = getattr(objective, "state", None)
    extra = objective_state(run) if objective_state is not None else {}
    if extra:
        state["objective"] = extra
    if run.ema is not None:
        state["ema"] = run.ema.state_dict()
    return state


def load_checkpoint_state(
    run: StageRun, objective: Objective | None, step: int | None = None
) -> dict[str, Any]:
    """Load the stage's checkpoint ``step`` (newest loadable: None) into ``run`` (and the
    objective's tensors); returns the checkpoint's plain data (loop step, RNG, ...)."""
    module = run.module
    state = checkpoint_state(run, objective)
    extra = run.checkpoints.load(state, step=step)
    set_model_state_dict(module, state["model"], options=checkpoint_options(module))
    set_optimizer_state_dict(module, run.optimizers, state["optim"])
    return extra
