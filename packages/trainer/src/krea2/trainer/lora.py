"""LoRA adapters on the DiT through ``peft``: inject them into a (meta or real) Krea2DiT,
freeze everything else, and name their tensors in the released module names.

peft wraps each target Linear ``X`` so its frozen weight becomes ``X.base_layer.weight``
and the adapter ``X.lora_A.default.weight`` [rank, in] / ``X.lora_B.default.weight``
[out, rank]. Checkpoints and exports speak the released names: the base as ``X.weight``,
the adapter as ``X.lora_A.weight`` / ``X.lora_B.weight`` (the layout diffusers' Krea 2
loader and ComfyUI read; see :mod:`krea2.trainer.adapters`).
"""

from __future__ import annotations

import re

from torch import Tensor, nn

from krea2.infra.errors import UserError
from krea2.trainer.config import LoraConfig

ADAPTER = "default"  # peft's adapter name; one adapter per stage
_PEFT_INFIX = re.compile(r"\.(lora_[AB])\." + ADAPTER + r"\.")


def target_modules(dit: nn.Module, cfg: LoraConfig) -> list[str]:
    """The DiT's Linear module names that ``cfg.targets`` matches in full, in module order;
    UserError when it matches none."""
    linears = [n for n, m in dit.named_modules() if isinstance(m, nn.Linear)]
    names = [n for n in linears if re.fullmatch(cfg.targets, n)]
    if not names:
        some = linears[:4]
        raise UserError(
            f"lora.targets={cfg.targets!r} matches no Linear of the DiT (names look like "
            f"{some}); remove it for the default attention and MLP projections"
        )
    return names


def apply_lora(dit: nn.Module, cfg: LoraConfig) -> list[str]:
    """Inject rank-``cfg.rank`` adapters into ``dit``'s target Linears in place (on the
    device the DiT lives on, meta included) and freeze every other parameter; returns the
    targets. A is Kaiming-uniform and B zero, so the adapted model starts equal to its base."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    names = target_modules(dit, cfg)
    peft_cfg = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha if cfg.alpha is not None else cfg.rank,
        lora_dropout=cfg.dropout,
        target_modules=names,
        init_lora_weights=True,
    )
    inject_adapter_in_model(peft_cfg, dit, adapter_name=ADAPTER)
    for name, p in dit.named_parameters():
        p.requires_grad_(is_adapter_key(name))
    return names


def reset_lora(dit: nn.Module) -> None:
    """Re-draw every adapter (A Kaiming-uniform, B zero) in place: after a meta build is
    materialised, whose ``init_weights`` gave the adapters' Linears their default init."""
    from peft.tuners.lora import LoraLayer

    for m in dit.modules():
        if isinstance(m, LoraLayer):
            m.reset_lora_parameters(ADAPTER, True)


def is_adapter_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def released_name(name: str) -> str:
    """A module state-dict name in released terms: ``X.base_layer.weight`` -> ``X.weight``,
    ``X.lora_A.default.weight`` -> ``X.lora_A.weight``; other names unchanged."""
    return _PEFT_INFIX.sub(r".\1.", name.replace(".base_layer.", "."))


def base_names(names) -> dict[str, str]:
    """{released name: module name} for the non-adapter entries of ``names`` (state-dict
    keys of a module that may carry adapters)."""
    return {released_name(n): n for n in names if not is_adapter_key(n)}


def adapter_tensors(state: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """The adapter entries of ``state`` under ``prefix`` (e.g. ``"model.dit."``), in released
    names without the prefix: ``blocks.0.attn.wq.lora_A.weight`` -> A [rank, in]."""
    return {
        released_name(k.removeprefix(prefix)): v
        for k, v in state.items()
        if k.startswith(prefix) and is_adapter_key(k)
    }


def checkpoint_options(module: nn.Module):
    """``StateDictOptions`` for a training module's checkpoints: every weight, or only the
    trainable ones when part of its DiT is frozen (LoRA), so a 12B base is not written per
    checkpoint (it is the stage's init_from, loaded again on resume)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in module.dit.parameters())
    return StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)


def merge_into(
    base: dict[str, Tensor], adapter: dict[str, Tensor], scale: float
) -> dict[str, Tensor]:
    """``base`` (released DiT keys) with ``scale * B @ A`` added to each adapted weight,
    computed in fp32 and stored in the base tensor's dtype; ``base`` is not modified.
    UserError when an adapter names a weight the base lacks or its shapes do not fit."""
    out = dict(base)
    for key in sorted(k for k in adapter if ".lora_A." in k):
        module = key.split(".lora_A.")[0]
        a, b = adapter[key].float(), adapter[f"{module}.lora_B.weight"].float()
        weight = f"{module}.weight"
        if weight not in base:
            raise UserError(f"the adapter adapts {module!r}, which the base weights lack")
        w = base[weight]
        if (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise UserError(
                f"adapter {module!r} is {b.shape[0]}x{a.shape[1]} but the base weight is "
                f"{tuple(w.shape)}: the adapter was trained on another model shape"
            )
        out[weight] = (w.float() + scale * (b @ a)).to(w.dtype)
    return out


__all__ = [
    "ADAPTER",
    "adapter_tensors",
    "apply_lora",
    "base_names",
    "checkpoint_options",
    "is_adapter_key",
    "merge_into",
    "released_name",
    "reset_lora",
    "target_modules",
]
