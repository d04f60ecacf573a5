"""What a finished stage leaves beside its checkpoints for users: a LoRA stage its adapter
(diffusers and ComfyUI layouts), a style stage its module as ``style.safetensors``."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from krea2.trainer.style_settings import stage_style_path


def write_stage_style(module: nn.Module, run_dir: str | Path, stage: str, is_main: bool) -> Path:
    """Gather ``module.style`` (FSDP-sharded or not: a collective, so every rank calls it)
    and write it on the main rank with its config; returns the path."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from krea2.dit import StyleModule, save_style_module

    style = module.style
    assert style is not None, "write_stage_style needs a module with a style module"
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(style, options=options)
    path = stage_style_path(run_dir, stage)
    if is_main:
        with torch.device("cpu"):
            plain = StyleModule(style.cfg)
        plain.load_state_dict({k: v.float() for k, v in state.items()})
        path.parent.mkdir(parents=True, exist_ok=True)
        save_style_module(plain, path)
    return path


def write_stage_products(
    job, stage_index: int, module: nn.Module, final: Path, is_main: bool
) -> list[Path]:
    """At stage ``stage_index``'s end (``final``: its last checkpoint): the adapter files of
    a LoRA stage and the module of a style stage (gathered on every rank: call it on all),
    written by the main rank; returns their paths."""
    stage = job.stages[stage_index]
    paths = []
    if getattr(module, "style", None) is not None:
        paths.append(write_stage_style(module, job.run_dir, stage.name, is_main))
    if is_main and stage.lora.enabled:
        from krea2.trainer.adapters import write_stage_adapters

        paths += write_stage_adapters(job, stage_index, final)
    return paths


__all__ = ["stage_style_path", "write_stage_products", "write_stage_style"]
