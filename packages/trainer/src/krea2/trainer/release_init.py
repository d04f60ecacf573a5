"""Released DiT weights (native ``.safetensors``, a diffusers transformer folder or a whole
model folder) as a stage's starting point: found, checked against the job's model config,
and loaded into a module built on the meta device and sharded.

The file is read by ``krea2.dit.weights.read_checkpoint`` (either key format, released
names out) on rank 0 only; ``set_model_state_dict(broadcast_from_rank0=True)`` then sends
each tensor to every rank, which keeps just its shard, so no rank but the first ever holds
the full 12B weights (24 GB in bf16) in host memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.dit.config import DiTConfig

# Config fields that decide tensor shapes, for the mismatch messages.
SHAPE_FIELDS = (
    "width",
    "depth",
    "heads",
    "kv_heads",
    "mlp_hidden_size",
    "time_dim",
    "text_dim",
    "text_taps",
    "text_heads",
    "text_kv_heads",
    "text_mlp_hidden_size",
    "layerwise_blocks",
    "refiner_blocks",
    "in_channels",
    "attn_gate",
)


def release_source(path: str | Path) -> Path | None:
    """The DiT weights that ``path`` names when it is released weights: a ``.safetensors``
    file, a diffusers transformer folder (``config.json``), or a model folder (diffusers
    pipeline layout or the native release layout, per ``krea2.dit.release``). None for
    anything else (a training-checkpoint directory); UserError when ``path`` is missing."""
    from krea2.dit.release import read_model_folder
    from krea2.dit.weights import is_training_checkpoint

    p = Path(path)
    if not p.exists():
        raise UserError(
            f"init_from {p} does not exist; give released weights or a run's checkpoints"
        )
    if p.is_file():
        return p
    if is_training_checkpoint(p) or any(p.glob("step-*")):
        return None
    if (p / "config.json").exists():
        return p
    if (p / "transformer" / "config.json").exists() or any(p.glob("*.safetensors")):
        return read_model_folder(p).transformer
    return None


def shape_mismatch(sd: dict[str, Tensor], file_cfg, cfg, where: str) -> str | None:
    """Why released-key tensors ``sd`` cannot load into a DiT of ``cfg`` (None: they fit):
    the differing config fields (from the file's recorded config, else inferred from its
    shapes) and the first differing tensor."""
    from krea2.dit.model import Krea2DiT
    from krea2.dit.weights import CheckpointError, infer_config

    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in Krea2DiT(cfg).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in sd.items()}
    if want == got:
        return None
    try:
        fields = shape_differences(file_cfg or infer_config(sd, patch=cfg.patch), cfg)
    except CheckpointError:
        fields = []
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    if wrong:
        first = f"tensor {wrong[0]!r} is {got[wrong[0]]}, the model's {want[wrong[0]]}"
    elif missing:
        first = f"{len(missing)} tensors missing (first {missing[0]!r})"
    else:
        first = f"{len(extra)} unexpected tensors (first {extra[0]!r})"
    differ = "; the checkpoint has " + ", ".join(fields) if fields else ""
    return f"{where}: the weights do not fit model {cfg.name!r}{differ}; {first}. {SHAPE_FIX}"


def shape_differences(have: DiTConfig, want: DiTConfig) -> list[str]:
    """``field value (config: value)`` for every shape field where ``have`` (weights)
    differs from ``want`` (the job's config)."""
    return [
        f"{f} {getattr(have, f)} (config: {getattr(want, f)})"
        for f in SHAPE_FIELDS
        if getattr(have, f) != getattr(want, f)
    ]


# What to do when released weights and the job's model config disagree.
SHAPE_FIX = (
    "Leave model.name and the shape overrides out to take the DiT's shape from init_from, "
    "or set them to the weights' shape (krea2-12b for the release)"
)


def load_release_weights(module: nn.Module, path: Path, distributed: bool, where: str) -> None:
    """Load released weights at ``path`` into ``module.dit`` (plain or FSDP-sharded, with or
    without LoRA adapters, which keep their values). Rank 0 reads and checks the file;
    a mismatch raises the same UserError on every rank (see :func:`shape_mismatch`)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from krea2.dit.weights import read_checkpoint
    from krea2.trainer.lora import base_names

    main = not distributed or dist.get_rank() == 0
    sd: dict[str, Tensor] = {}
    problem = None
    if main:
        try:
            sd, file_cfg = read_checkpoint(path)
            problem = shape_mismatch(sd, file_cfg, module.dit.cfg, where)
        except UserError as e:
            problem = f"{where}: {e}"
    if distributed:
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem is not None:
        raise UserError(problem)
    names = base_names(k for k in module.state_dict() if k.startswith("dit."))
    full = {names[f"dit.{k}"]: v for k, v in sd.items()}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed, strict=False)
    set_model_state_dict(module, full, options=options)
