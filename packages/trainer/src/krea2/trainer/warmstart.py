"""Start a stage from earlier weights: the previous stage's newest checkpoint, a checkpoint
directory (pixel layers resized when the stage changes the DiT's patch), or released
weights (native or diffusers, read by ``krea2.dit``), into a module that may carry LoRA
adapters and may be sharded."""

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
from krea2.trainer.lora import base_names
from krea2.trainer.release_init import load_release_weights, release_source
from krea2.trainer.style_settings import trains_style_only

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
    """Where ``cfg.stages[i]`` starts from (a checkpoint directory) and that source's patch
    (the previous stage's, else the model config's; the saved first layer's width wins,
    :func:`_saved_patch`); None for the seeded init or released weights."""
    stage = cfg.stages[i]
    if stage.init_from == "previous" and i > 0:
        prev = cfg.stages[i - 1]  # (a LoRA one is merged by _load_start instead)
        return stage_checkpoints(cfg.run_dir, prev.name), dit_config(cfg, prev).patch
    if stage.init_from not in ("previous", "none") and release_source(stage.init_from) is None:
        return Path(stage.init_from), dit_config(cfg).patch
    return None


def _saved_patch(source: Path, channels: int) -> int | None:
    """The patch a checkpoint (a directory of one, or a stage's checkpoints folder: its
    newest) was saved at, read from its first layer's input width (patch² · channels);
    None when it cannot be read (then the config's patch is assumed)."""
    from torch.distributed.checkpoint import FileSystemReader

    directory = source
    if not (source / ".metadata").exists():
        step = CheckpointManager(source).latest_step() if source.is_dir() else None
        if step is None:
            return None
        directory = CheckpointManager(source).path_of(step)
    try:
        meta = FileSystemReader(directory).read_metadata().state_dict_metadata
    except Exception:  # unreadable: the load below names the problem
        return None
    size = getattr(meta.get("model.dit.first.weight"), "size", None)
    if size is None or len(size) != 2:
        return None
    patch = round((size[1] / channels) ** 0.5)
    return patch if patch * patch * channels == size[1] else None


def warm_start(cfg: JobConfig, i: int, module: TrainModule, distributed: bool) -> None:
    """Load the weights ``cfg.stages[i]`` starts from into ``module`` (DiT and text; not the
    iREPA head or LoRA adapters), resized to the stage's patch; nothing when the stage
    starts fresh. Released weights are read on rank 0 and scattered shard by shard. A
    LoRA stage's frozen base is then quantized when ``model.base_quant`` asks."""
    _load_start(cfg, i, module, distributed)
    if cfg.stages[i].lora.enabled:
        from krea2.trainer.basequant import quantize_base

        device = next(module.dit.parameters()).device
        quantize_base(module.dit, cfg.model.base_quant, device)


def _load_start(cfg: JobConfig, i: int, module: TrainModule, distributed: bool) -> None:
    stage = cfg.stages[i]
    if stage.init_from == "previous" and i > 0 and cfg.stages[i - 1].lora.enabled:
        # a LoRA stage's result is its start plus its adapters: load that start, then
        # merge the adapters of its newest checkpoint (its EMA when it kept one)
        _load_start(cfg, i - 1, module, distributed)
        _merge_stage_adapters(cfg, i - 1, module)
        log.info(
            "stage %s starts from stage %s, adapters merged", stage.name, cfg.stages[i - 1].name
        )
        return
    if stage.init_from == "previous" and i > 0 and trains_style_only(cfg.stages[i - 1]):
        # a style stage trains only its module: the base after it is the one before it
        _load_start(cfg, i - 1, module, distributed)
        return
    if stage.init_from not in ("previous", "none"):
        weights = release_source(stage.init_from)
        if weights is not None:
            load_release_weights(module, weights, distributed, f"stage {stage.name!r} init_from")
            log.info("stage %s starts from released weights %s", stage.name, weights)
            return
    found = _source(cfg, i)
    if found is None:
        return
    source, source_patch = found
    channels = module.dit.cfg.latent_channels
    source_patch = _saved_patch(source, channels) or source_patch
    full = get_model_state_dict(module)
    # Checkpoints name the base in released terms; adapters (peft) rename the Linears
    # they wrap, so load under the released names and map back after.
    names = base_names(k for k in full if not k.startswith(("irepa.", "style.")))
    wanted = {k: full[m] for k, m in names.items()}
    patch = module.dit.cfg.patch
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
    wanted = {names[k]: v for k, v in wanted.items()}
    set_model_state_dict(module, wanted, options=StateDictOptions(strict=False))
    log.info("stage %s starts from %s", stage.name, source)


def stage_adapter(cfg: JobConfig, i: int) -> dict[str, torch.Tensor]:
    """The adapter (released names, A [rank, in] and B [out, rank]) of LoRA stage ``i``'s
    newest checkpoint; UserError when the stage has none."""
    from krea2.trainer.checkpoint_tensors import read_adapter

    stage = cfg.stages[i]
    mgr = CheckpointManager(stage_checkpoints(cfg.run_dir, stage.name))
    step = mgr.latest_step()
    if step is None:
        raise UserError(
            f"LoRA stage {stage.name!r} has no checkpoint under {mgr.root}; train it first"
        )
    return read_adapter(mgr.path_of(step))


def _merge_stage_adapters(cfg: JobConfig, i: int, module: TrainModule) -> None:
    """Add LoRA stage ``i``'s ``scale * B @ A`` to the weights it adapted in ``module``
    (fp32 sums stored in each weight's dtype; sharded weights stay sharded)."""
    from torch.distributed.tensor import DTensor

    adapter = stage_adapter(cfg, i)
    scale = cfg.stages[i].lora.scale
    full = get_model_state_dict(module)
    names = base_names(k for k in full if not k.startswith(("irepa.", "style.")))
    merged = {}
    for key in sorted(k for k in adapter if ".lora_A." in k):
        adapted = key.split(".lora_A.")[0]
        name = names.get(f"dit.{adapted}.weight")
        if name is None:
            raise UserError(
                f"stage {cfg.stages[i].name!r} adapts {adapted!r}, which the model lacks"
            )
        weight = full[name]
        dense = weight.full_tensor() if isinstance(weight, DTensor) else weight
        a, b = adapter[key].float(), adapter[f"{adapted}.lora_B.weight"].float()
        if (b.shape[0], a.shape[1]) != tuple(dense.shape):
            raise UserError(
                f"stage {cfg.stages[i].name!r}'s adapter {adapted!r} is {b.shape[0]}x{a.shape[1]} "
                f"but the next stage's weight is {tuple(dense.shape)} (another patch or shape)"
            )
        sum_ = (dense.float().cpu() + scale * (b @ a)).to(dense.dtype)
        merged[name] = _like(sum_, weight)
    set_model_state_dict(module, merged, options=StateDictOptions(strict=False))
