"""Reading tensors out of saved checkpoints without a model: a DCP step folder's tensors by
name (no process group needed), a released ``.safetensors`` under the same names, and a
LoRA stage's adapter."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from krea2.infra.errors import UserError

__all__ = ["DIT_PREFIX", "load_tensors", "read_adapter", "tensor_keys"]

DIT_PREFIX = "model.dit."


def tensor_keys(step_dir: Path, prefix: str) -> dict[str, TensorStorageMetadata]:
    """The tensors a DCP checkpoint folder holds under ``prefix``: name -> metadata."""
    meta = FileSystemReader(step_dir).read_metadata().state_dict_metadata
    return {
        k: v
        for k, v in meta.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }


def load_tensors(source: Path, keys: list[str], meta: dict) -> dict[str, torch.Tensor]:
    """``keys`` of a DCP checkpoint folder (``meta``: their :func:`tensor_keys`) or of a
    released-key ``.safetensors`` file (``model.dit.`` names), as fp32 tensors on CPU."""
    if source.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(source), "pt") as f:
            return {k: f.get_tensor(k.removeprefix(DIT_PREFIX)).float() for k in keys}
    out = {k: torch.empty(tuple(meta[k].size), dtype=meta[k].properties.dtype) for k in keys}
    dcp.load(out, storage_reader=FileSystemReader(source), no_dist=True)
    return {k: v.float() for k, v in out.items()}


def read_adapter(step_dir: Path) -> dict[str, torch.Tensor]:
    """The adapter of a LoRA stage's checkpoint folder ``step-N``, in released names;
    UserError when it holds none (a full fine-tuning stage)."""
    from krea2.trainer.lora import adapter_tensors, is_stage_adapter_key

    meta = {k: v for k, v in tensor_keys(step_dir, "model.dit.").items()
            if is_stage_adapter_key(k)}  # fmt: skip
    if not meta:
        raise UserError(f"{step_dir} holds no LoRA adapter (a full fine-tuning checkpoint?)")
    return adapter_tensors(load_tensors(step_dir, sorted(meta), meta), "model.dit.")
