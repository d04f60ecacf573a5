"""Use a trained job after the fact: a stage's final weights as a module, and its samples.

The demo and notebooks sample from a finished (or untrained) stage exactly the way the
trainer's own sample grids do: same module (text conditioner included), same autoencoder,
same time shift.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from krea2.infra.errors import UserError
from krea2.trainer.build import TrainModule, build_autoencoder, build_module, dit_config
from krea2.trainer.config import JobConfig
from krea2.trainer.distributed import init_distributed
from krea2.trainer.evaluate import sample_grid
from krea2.trainer.objective import stage_mu


def load_stage_module(job: JobConfig, stage_index: int, trained: bool = True) -> TrainModule:
    """The module of ``job.stages[stage_index]`` in eval mode: with the newest complete
    checkpoint of that stage (``trained``), or the seeded initialization the job starts from.

    Raises ``UserError`` when a trained module is asked for and the stage has no checkpoint.
    """
    import torch.distributed.checkpoint.state_dict as sd

    from krea2.infra.checkpoint import CheckpointManager

    stage = job.stages[stage_index]
    module = build_module(job, stage, init_distributed(job))
    if trained:
        state = {"model": sd.get_model_state_dict(module)}
        root = Path(job.run_dir) / "checkpoints" / stage.name
        try:
            CheckpointManager(root).load(state)
        except FileNotFoundError as exc:
            raise UserError(
                f"stage {stage.name!r} has no complete checkpoint under {root}; train it first"
            ) from exc
        sd.set_model_state_dict(module, state["model"])
    return module.eval()


def sample_stage(
    job: JobConfig,
    stage_index: int,
    prompts: list[str],
    seeds: list[int],
    steps: int,
    cfg_scale: float,
    trained: bool = True,
) -> np.ndarray:
    """uint8 images [len(prompts), len(seeds), side, side, 3] at the stage's resolution,
    sampled with the stage's time shift (Euler, ``steps`` steps, CFG ``cfg_scale``)."""
    stage = job.stages[stage_index]
    module = load_stage_module(job, stage_index, trained)
    device = next(module.parameters()).device
    ae = build_autoencoder(job.model, device)
    side = stage.resolution
    tokens = (side // (ae.spatial_factor * dit_config(job, stage).patch)) ** 2
    mu = stage_mu(stage.time_shift, tokens)
    return sample_grid(module, ae, prompts, seeds, (side, side), steps, cfg_scale, mu)
