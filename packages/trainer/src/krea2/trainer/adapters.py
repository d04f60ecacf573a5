"""LoRA adapters out of a run: the diffusers file ``Krea2Pipeline.load_lora_weights`` reads,
the ComfyUI key layout, or merged into the base weights in either checkpoint format.

An adapter is a dict of released-name tensors, ``X.lora_A.weight`` [rank, in] and
``X.lora_B.weight`` [out, rank] per adapted Linear ``X`` (see :mod:`krea2.trainer.lora`);
the update it stands for is ``(alpha / rank) * B @ A``.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path

import torch
from torch import Tensor

from krea2.infra.errors import UserError
from krea2.trainer.checkpoint_tensors import read_adapter
from krea2.trainer.config import JobConfig, LoraConfig

DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
COMFYUI_PREFIX = "diffusion_model."  # the prefix ComfyUI (and Krea's own trainer) write


class AdapterFormat(enum.StrEnum):
    DIFFUSERS = "diffusers"  # a folder with pytorch_lora_weights.safetensors
    COMFYUI = "comfyui"  # one .safetensors: diffusion_model.X.lora_A/B.weight + X.alpha
    KREA_MERGED = "krea-merged"  # the base + adapter, released keys (.safetensors)
    DIFFUSERS_MERGED = "diffusers-merged"  # the base + adapter, a diffusers transformer folder


def adapted_modules(adapter: dict[str, Tensor]) -> list[str]:
    return sorted(k.split(".lora_A.")[0] for k in adapter if ".lora_A." in k)


def save_diffusers(adapter: dict[str, Tensor], lora: LoraConfig, out_dir: Path) -> Path:
    """Write ``out_dir/pytorch_lora_weights.safetensors`` through diffusers' own
    ``Krea2Pipeline.save_lora_weights``: diffusers module names (``krea2.dit``'s key map)
    and the peft config (rank, alpha) as its adapter metadata, so ``load_lora_weights``
    scales the update by alpha / rank. Returns the file."""
    from diffusers import Krea2Pipeline

    from krea2.dit.keymap import krea_to_diffusers

    layers = {k: v.contiguous() for k, v in krea_to_diffusers(adapter).items()}
    targets = sorted({k.rsplit(".lora_", 1)[0] for k in layers})
    metadata = {
        "r": lora.rank,
        "lora_alpha": lora.alpha if lora.alpha is not None else lora.rank,
        "target_modules": targets,
        "lora_dropout": 0.0,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    Krea2Pipeline.save_lora_weights(
        out_dir,
        transformer_lora_layers=layers,
        weight_name=DIFFUSERS_FILE,
        transformer_lora_adapter_metadata=metadata,
    )
    return out_dir / DIFFUSERS_FILE


def comfyui_state(adapter: dict[str, Tensor], lora: LoraConfig) -> dict[str, Tensor]:
    """The ComfyUI layout: ``diffusion_model.<released module>.lora_A/lora_B.weight`` plus a
    scalar ``.alpha`` per module (ComfyUI scales by alpha / rank)."""
    alpha = float(lora.alpha if lora.alpha is not None else lora.rank)
    out = {COMFYUI_PREFIX + k: v.contiguous() for k, v in adapter.items()}
    for module in adapted_modules(adapter):
        out[f"{COMFYUI_PREFIX}{module}.alpha"] = torch.tensor(alpha)
    return out


def save_comfyui(adapter: dict[str, Tensor], lora: LoraConfig, out: Path) -> Path:
    from safetensors.torch import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"krea2.lora": json.dumps({"rank": lora.rank, "alpha": lora.alpha})}
    save_file(comfyui_state(adapter, lora), str(out), metadata=meta)
    return out


def base_weights(job: JobConfig, stage_index: int, base: Path | None) -> dict[str, Tensor]:
    """The released-key DiT weights a LoRA stage adapted: ``base`` when given, else the
    stage's init_from (released weights or the previous stage's newest checkpoint)."""
    from krea2.dit.weights import read_checkpoint
    from krea2.infra.checkpoint import CheckpointManager
    from krea2.trainer.merge import average
    from krea2.trainer.release_init import release_source

    stage = job.stages[stage_index]
    if base is not None:
        return read_checkpoint(release_source(base) or base)[0]
    if stage.init_from not in ("previous", "none") and release_source(stage.init_from):
        return read_checkpoint(release_source(stage.init_from))[0]
    if stage.init_from == "previous" and stage_index > 0:
        prev = stage_index - 1
        if job.stages[prev].lora.enabled:  # its result: its own base plus its adapters
            from krea2.trainer.lora import merge_into
            from krea2.trainer.warmstart import stage_adapter

            scale = job.stages[prev].lora.scale
            return merge_into(base_weights(job, prev, None), stage_adapter(job, prev), scale)
        root = Path(job.run_dir) / "checkpoints" / job.stages[prev].name
    else:
        root = Path(stage.init_from)
    mgr = CheckpointManager(root)
    if mgr.latest_step() is None:
        raise UserError(f"the base of stage {stage.name!r} ({root}) has no checkpoint; pass --base")
    return average([mgr.path_of(mgr.latest_step())])


def export_adapter(
    job: JobConfig,
    stage_index: int,
    step_dir: Path,
    out: Path,
    fmt: AdapterFormat | str,
    base: Path | None = None,
) -> Path:
    """Write the adapter of ``step_dir`` (a checkpoint of LoRA stage ``stage_index``) to
    ``out`` in ``fmt``; merged formats add it to the base (:func:`base_weights`) and
    record the job's conditioning. Returns what was written."""
    from krea2.dit.weights import save_weights
    from krea2.trainer.build import dit_config
    from krea2.trainer.inference import conditioning_record
    from krea2.trainer.lora import merge_into

    fmt = AdapterFormat(fmt)
    stage = job.stages[stage_index]
    if not stage.lora.enabled:
        raise UserError(f"stage {stage.name!r} trains the full model, not a LoRA adapter")
    adapter = read_adapter(step_dir)
    if fmt is AdapterFormat.DIFFUSERS:
        return save_diffusers(adapter, stage.lora, out)
    if fmt is AdapterFormat.COMFYUI:
        return save_comfyui(adapter, stage.lora, out)
    merged = merge_into(base_weights(job, stage_index, base), adapter, stage.lora.scale)
    kind = "krea" if fmt is AdapterFormat.KREA_MERGED else "diffusers"
    cfg, record = dit_config(job, stage), conditioning_record(job, stage)
    return save_weights(merged, out, format=kind, config=cfg, conditioning=record)


FOLDER_FORMATS = (AdapterFormat.DIFFUSERS, AdapterFormat.DIFFUSERS_MERGED)


def check_export_target(out: Path, fmt: AdapterFormat | str, force: bool = False) -> None:
    """UserError (one line, naming the fix) unless ``out`` is the kind of path ``fmt``
    writes: a folder for the diffusers layouts, a ``.safetensors`` file for the others;
    and unless it is new, or ``force`` allows replacing it."""
    fmt = AdapterFormat(fmt)
    if fmt in FOLDER_FORMATS:
        if out.suffix == ".safetensors" or out.is_file():
            raise UserError(
                f"--format {fmt} writes a folder, but --out {out} names a file; give a folder, "
                f"e.g. --out {out.with_suffix('')}/"
            )
        taken = out.is_dir() and any(out.iterdir())
    else:
        if out.suffix != ".safetensors" or out.is_dir():
            example = out / "lora.safetensors" if out.is_dir() else out.with_suffix(".safetensors")
            raise UserError(
                f"--format {fmt} writes one .safetensors file, but --out {out} is not one; "
                f"give a file name, e.g. --out {example}"
            )
        taken = out.exists()
    if taken and not force:
        raise UserError(f"{out} exists; pass --force to replace it, or choose another --out")


def export_run_adapter(
    run_dir: Path,
    out: Path,
    fmt: AdapterFormat | str,
    stage: str | None = None,
    step: int | None = None,
    base: Path | None = None,
) -> Path:
    """:func:`export_adapter` for a run directory (its saved config.toml): the checkpoint
    of ``step`` (None: the newest) of LoRA stage ``stage`` (None: the last with one)."""
    from krea2.trainer.inference import checkpoint_steps, load_run, pick_stage, stage_root

    job = load_run(run_dir)
    index = pick_stage(job, stage)
    steps = checkpoint_steps(job, index)
    if not steps or (step is not None and step not in steps):
        raise UserError(
            f"stage {job.stages[index].name!r} has no complete checkpoint"
            + (f" of step {step}" if step is not None else "")
            + f"; its checkpoints: {steps}"
        )
    from krea2.infra.checkpoint import CheckpointManager

    root = stage_root(job, job.stages[index])
    step_dir = CheckpointManager(root).path_of(step if step is not None else steps[-1])
    return export_adapter(job, index, step_dir, out, fmt, base)


def write_stage_adapters(job: JobConfig, stage_index: int, step_dir: Path) -> list[Path]:
    """At a LoRA stage's end: its adapter in the diffusers and ComfyUI layouts under
    ``run_dir/adapters/<stage>/`` (what users load; merged weights are on request)."""
    root = Path(job.run_dir) / "adapters" / job.stages[stage_index].name
    return [
        export_adapter(job, stage_index, step_dir, root, AdapterFormat.DIFFUSERS),
        export_adapter(job, stage_index, step_dir, root / "comfyui.safetensors", "comfyui"),
    ]
