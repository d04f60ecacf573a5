"""LoRA adapter files applied to a loaded DiT at sampling time, at any scale, and removed
afterwards: what `krea2 dit sample --lora` and `krea2 dit serve --lora NAME=PATH` use.

An adapter file is read in any of the layouts `krea2 train export` writes: diffusers'
(``pytorch_lora_weights.safetensors``, or the folder holding it: ``transformer.``-prefixed
diffusers names, rank and alpha in its ``lora_adapter_metadata``), ComfyUI's
(``diffusion_model.``-prefixed released names with a scalar ``.alpha`` per module), or bare
released names (``blocks.0.attn.wq.lora_A.weight``). Each adapted Linear ``X`` holds
``A`` [rank, in] and ``B`` [out, rank]; its update is ``(alpha / rank) * B @ A``.

:func:`applied` adds ``scale * (alpha / rank) * (x @ A^T) @ B^T`` to each adapted Linear's
output with forward hooks instead of changing the weights: nothing to undo, so the base
comes back bit for bit however many requests with other adapters or scales came between.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from krea2.dit.flag_values import split_number_suffix
from krea2.infra.errors import UserError

__all__ = ["LoraAdapter", "applied", "load_lora", "named_lora_files", "parse_lora_spec"]

DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
DIFFUSERS_PREFIX = "transformer."  # diffusers' LoRA files name the pipeline component


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter: ``name``, and per adapted Linear (released module name) its ``A``
    [rank, in], ``B`` [out, rank] and ``alpha / rank``."""

    name: str
    modules: dict[str, tuple[Tensor, Tensor, float]]

    @property
    def rank(self) -> int:
        return max(a.shape[0] for a, _, _ in self.modules.values())

    def check_fits(self, net: nn.Module) -> None:
        """UserError unless every adapted module is a Linear of ``net`` of the adapter's
        shape (an adapter trained on another model shape or architecture)."""
        for module, (a, b, _) in self.modules.items():
            try:
                layer = net.get_submodule(module)
            except AttributeError:
                raise UserError(
                    f"LoRA {self.name!r} adapts {module!r}, which this model lacks: it was "
                    "trained on another architecture"
                ) from None
            weight = getattr(layer, "weight", None)
            if weight is None or tuple(weight.shape) != (b.shape[0], a.shape[1]):
                shape = None if weight is None else tuple(weight.shape)
                raise UserError(
                    f"LoRA {self.name!r} adapts {module!r} as {b.shape[0]}x{a.shape[1]} but "
                    f"the model's weight is {shape}: it was trained on another model shape"
                )

    def to(self, device: torch.device | str, dtype: torch.dtype) -> LoraAdapter:
        moved = {m: (a.to(device, dtype), b.to(device, dtype), s)
                 for m, (a, b, s) in self.modules.items()}  # fmt: skip
        return LoraAdapter(self.name, moved)


def load_lora(path: str | Path, name: str | None = None) -> LoraAdapter:
    """The adapter in ``path`` (a .safetensors file, or a diffusers folder holding
    ``pytorch_lora_weights.safetensors``), named ``name`` (default: the file's stem, or the
    folder's name). UserError when it is missing, holds no LoRA tensors, or pairs them
    wrongly."""
    from safetensors import safe_open

    from krea2.dit.keymap import to_krea

    path = Path(path)
    if path.is_dir():
        name = name or path.name
        path = path / DIFFUSERS_FILE
    if not path.is_file():
        raise UserError(f"LoRA file {path} does not exist (a .safetensors file or a diffusers "
                        f"folder holding {DIFFUSERS_FILE})")  # fmt: skip
    name = name or path.stem
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            metadata = f.metadata() or {}
    except Exception as e:  # a torn or foreign file: safetensors says why
        raise UserError(f"cannot read LoRA file {path}: {e}") from None
    if tensors and all(k.startswith(DIFFUSERS_PREFIX) for k in tensors):
        tensors = {k[len(DIFFUSERS_PREFIX) :]: v for k, v in tensors.items()}
    if not any(".lora_A." in k or ".lora_B." in k for k in tensors):
        raise UserError(f"{path} holds no LoRA tensors (keys like X.lora_A.weight)")
    # keymap's to_krea: diffusers module names -> released ones, ComfyUI's prefix dropped;
    # the per-module .alpha scalars are renamed with their module
    renamed = to_krea(tensors)
    alphas = {k[: -len(".alpha")]: float(v) for k, v in renamed.items() if k.endswith(".alpha")}
    released = {k: v for k, v in renamed.items() if ".lora_A." in k or ".lora_B." in k}
    default_alpha = _metadata_alpha(metadata)
    modules: dict[str, tuple[Tensor, Tensor, float]] = {}
    for key in sorted(k for k in released if ".lora_A." in k):
        module = key.split(".lora_A.")[0]
        b_key = f"{module}.lora_B.weight"
        if b_key not in released:
            raise UserError(f"{path}: {module}.lora_A has no lora_B beside it")
        a, b = released[key].float(), released[b_key].float()
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise UserError(f"{path}: {module}: lora_A {tuple(a.shape)} and lora_B "
                            f"{tuple(b.shape)} are not [rank, in] and [out, rank]")  # fmt: skip
        rank = a.shape[0]
        alpha = alphas.get(module, default_alpha if default_alpha is not None else rank)
        modules[module] = (a, b, alpha / rank)
    if len(modules) * 2 != len(released):
        raise UserError(f"{path}: some lora_B tensors have no lora_A beside them")
    return LoraAdapter(name, modules)


def _metadata_alpha(metadata: dict[str, str]) -> float | None:
    """lora_alpha from diffusers' ``lora_adapter_metadata`` (its keys prefixed
    ``transformer.``), or our own ``krea2.lora`` record; None when neither says."""
    for key, field in (("lora_adapter_metadata", "lora_alpha"), ("krea2.lora", "alpha")):
        if key not in metadata:
            continue
        try:
            record = json.loads(metadata[key])
        except json.JSONDecodeError:
            continue
        for k, v in record.items():
            if (k == field or k.endswith("." + field)) and isinstance(v, int | float):
                return float(v)
    return None


@contextmanager
def applied(net: nn.Module, adapters: Sequence[tuple[LoraAdapter, float]]) -> Iterator[None]:
    """Within the block, each Linear an adapter adapts returns its output plus the sum over
    ``adapters`` of ``scale * (alpha / rank) * (x @ A^T) @ B^T`` (computed in the input's
    dtype). Checks every adapter against ``net`` first; the hooks are removed on exit,
    also on an error. A scale of 0 adds nothing and registers no hook."""
    per_module: dict[str, list[tuple[Tensor, Tensor, float]]] = {}
    for adapter, scale in adapters:
        if scale == 0:
            continue
        adapter.check_fits(net)
        for module, (a, b, s) in adapter.modules.items():
            per_module.setdefault(module, []).append((a, b, scale * s))
    handles = []
    try:
        for module, terms in per_module.items():
            handles.append(net.get_submodule(module).register_forward_hook(_hook(terms)))
        yield
    finally:
        for h in handles:
            h.remove()


def _hook(terms: list[tuple[Tensor, Tensor, float]]):
    def add_updates(_module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
        x = inputs[0]
        for a, b, s in terms:
            a, b = a.to(x.device, x.dtype), b.to(x.device, x.dtype)
            output = output + s * ((x @ a.T) @ b.T)
        return output

    return add_updates


def parse_lora_spec(spec: str, named: bool = False) -> tuple[str | None, Path, float]:
    """``--lora`` values: 'path.safetensors[:SCALE]' (``named=False``: sample) or
    'NAME=path' (``named=True``: serve). Returns (name or None, path, scale 1.0 unless
    given). UserError for an empty name or path, or a scale that is not a finite number."""
    if named:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path:
            raise UserError(f"--lora {spec!r}: write NAME=PATH, e.g. "
                            "--lora maroon=out/maroon.safetensors")  # fmt: skip
        return name.strip(), Path(path), 1.0
    path, scale = split_number_suffix(spec)
    if not path:
        raise UserError(f"--lora {spec!r} names no file; write PATH[:SCALE] (a.safetensors:0.8)")
    if scale is not None and not math.isfinite(scale):
        raise UserError(f"--lora {spec!r}: the scale must be a finite number")
    return None, Path(path), 1.0 if scale is None else scale


def named_lora_files(specs: Sequence[str]) -> dict[str, Path]:
    """`krea2 dit serve --lora NAME=PATH` values as name -> path; UserError for a name
    given twice or a path that does not exist (before anything loads)."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, path, _ = parse_lora_spec(spec, named=True)
        assert name is not None
        if name in out:
            raise UserError(f"--lora {spec!r}: the name {name!r} is given twice")
        if not path.exists():
            raise UserError(f"--lora {spec!r}: {path} does not exist")
        out[name] = path
    return out
