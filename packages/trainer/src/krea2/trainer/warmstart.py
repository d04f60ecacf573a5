"""Start a stage from earlier weights: the previous stage's newest checkpoint or a checkpoint
directory, with the pixel layers resized when the stage changes the DiT's patch."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from krea2.infra.checkpoint import CheckpointManager
from krea2.infra.errors import UserError
from krea2.infra.logging import get_logger
from krea2.trainer.build import TrainModule, dit_config
from krea2.trainer.config import JobConfig

log = get_logger("trainer")


def stage_checkpoints(run_dir: str | Path, stage_name: str) -> Path:
    """The directory holding a stage's ``step-*`` checkpoints."""
    return Path(run_dir) / "checkpoints" / stage_name


def _like(value: torch.Tensor, target) -> torch.Tensor:
    """``value`` (a full tensor) laid out as ``target``: sharded the same way if a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        return distribute_tensor(value.to(target.device), target.device_mesh, target.placements)
    return value.to(target.device)


def _source(cfg: JobConfig, i: int) -> tuple[Path, int] | None:
    """Where ``cfg.stages[i]`` starts from and that source's patch (the previous stage's,
    else the model config's: a weights directory is assumed to be of the job's model)."""
    stage = cfg.stages[i]
    if stage.init_from == "previous" and i > 0:
        prev = cfg.stages[i - 1]
        return stage_checkpoints(cfg.run_dir, prev.name), dit_config(cfg, prev).patch
    if stage.init_from not in ("previous", "none") and Path(stage.init_from).is_dir():
        return Path(stage.init_from), dit_config(cfg).patch
    return None  # the seeded init, or a weights file (loaded when the module is built)


def warm_start(cfg: JobConfig, i: int, module: TrainModule, distributed: bool) -> None:
    """Load the weights ``cfg.stages[i]`` starts from into ``module`` (DiT and text; not the
    iREPA head), resized to the stage's patch; nothing when the stage starts fresh."""
    stage = cfg.stages[i]
    found = _source(cfg, i)
    if found is None:
        return
    source, source_patch = found
    full = get_model_state_dict(module)
    wanted = {k: v for k, v in full.items() if not k.startswith("irepa.")}
    patch = module.dit.cfg.patch
    channels = module.dit.cfg.latent_channels
    if source_patch != patch:  # load the source's shapes, then resize them to this stage's
        from krea2.dit.patch_resize import resize_patch_weights, shapes_at_patch

        for key, shape in shapes_at_patch(full, source_patch, channels, "dit.").items():
            wanted[key] = torch.empty(shape, dtype=full[key].dtype, device="cpu")
    if (source / ".metadata").exists():  # a single checkpoint directory
        import torch.distributed.checkpoint as dcp

        dcp.load({"model": wanted}, checkpoint_id=source, no_dist=not distributed)
    else:
        mgr = CheckpointManager(source)
        if mgr.latest_step() is None:
            raise UserError(f"stage {stage.name!r} starts from {source}, which has no checkpoint")
        mgr.load({"model": wanted})
    if source_patch != patch:
        resized = resize_patch_weights(wanted, source_patch, patch, channels, prefix="dit.")
        for key in shapes_at_patch(full, patch, channels, "dit."):
            wanted[key] = _like(resized[key], full[key])
        log.info("stage %s: patch %d -> %d, pixel layers resized", stage.name, source_patch, patch)
    set_model_state_dict(module, wanted, options=StateDictOptions(strict=False))
    log.info("stage %s starts from %s", stage.name, source)
