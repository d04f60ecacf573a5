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
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from krea2.infra.errors import UserError
from krea2.trainer.config import LoraConfig

ADAPTER = "default"  # peft's adapter name: the stage's own adapter
_PEFT_INFIX = re.compile(r"\.(lora_[AB])\." + ADAPTER + r"\.")
# An adapter an objective trains beside the stage's own (e.g. TDM's fake score): any
# other peft adapter name, ``X.lora_A.fake.weight``
_OBJECTIVE_INFIX = re.compile(r"\.lora_[AB]\.(?!" + ADAPTER + r"\.)[A-Za-z_]\w*\.")


def target_modules(dit: nn.Module, cfg: LoraConfig) -> list[str]:
    """The DiT's Linear module names that ``cfg.targets`` matches in full, in module order
    (a Linear that already carries an adapter counts under its own name); UserError when
    it matches none."""
    from peft.tuners.lora import LoraLayer

    linears = [n for n, m in dit.named_modules() if isinstance(m, nn.Linear | LoraLayer)]
    names = [n for n in linears if re.fullmatch(cfg.targets, n)]
    if not names:
        some = linears[:4]
        raise UserError(
            f"lora.targets={cfg.targets!r} matches no Linear of the DiT (names look like "
            f"{some}); remove it for the default attention and MLP projections"
        )
    return names


def apply_lora(dit: nn.Module, cfg: LoraConfig, adapter: str = ADAPTER) -> list[str]:
    """Inject rank-``cfg.rank`` adapters named ``adapter`` into ``dit``'s target Linears in
    place (on the device the DiT lives on, meta included) and freeze every parameter but
    the adapters'; returns the targets. A is Kaiming-uniform and B zero, so the adapted model
    starts equal to its base. A second name adds a second adapter on the same Linears
    (an objective's, e.g. TDM's fake score); the stage's own (``ADAPTER``) stays the one in
    use (:func:`adapter_in_use` switches)."""
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
    with warnings.catch_warnings():
        # peft warns that a second adapter makes several: that is what it is for here
        warnings.filterwarnings("ignore", "Already found a `peft_config`", UserWarning)
        inject_adapter_in_model(peft_cfg, dit, adapter_name=adapter)
    _select(dit, ADAPTER)
    for name, p in dit.named_parameters():
        p.requires_grad_(is_adapter_key(name))
    return names


def _select(dit: nn.Module, adapter: str | None) -> list[tuple[nn.Module, object, bool]]:
    """Make ``adapter`` (None: none, the bare base) the one every LoRA Linear of ``dit``
    applies; returns what each had. peft's own ``set_adapter``/``enable_adapters`` also
    flip ``requires_grad`` (freezing the other adapters), which would change what the
    trainer's optimizer and FSDP see mid-step; these two flags are all its forward reads."""
    from peft.tuners.lora import LoraLayer

    before = []
    for m in dit.modules():
        if isinstance(m, LoraLayer):
            before.append((m, m._active_adapter, m._disable_adapters))
            m._disable_adapters = adapter is None
            if adapter is not None:
                m._active_adapter = adapter
    return before


@contextmanager
def adapter_in_use(dit: nn.Module, adapter: str | None) -> Iterator[None]:
    """Within the block, ``dit``'s LoRA Linears apply only the adapter named ``adapter``
    (None: no adapter, the frozen base). Keep a backward inside the block when the forward
    ran in it: activation checkpointing recomputes the forward during the backward."""
    before = _select(dit, adapter)
    try:
        yield
    finally:
        for m, active, disabled in before:
            m._active_adapter, m._disable_adapters = active, disabled


def reset_lora(dit: nn.Module) -> None:
    """Re-draw every adapter (A Kaiming-uniform, B zero) in place: after a meta build is
    materialised, whose ``init_weights`` gave the adapters' Linears their default init."""
    from peft.tuners.lora import LoraLayer

    for m in dit.modules():
        if isinstance(m, LoraLayer):
            for adapter in list(m.lora_A):
                m.reset_lora_parameters(adapter, True)


def is_adapter_key(name: str) -> bool:
    """Whether ``name`` is a tensor of any LoRA adapter (the stage's or an objective's)."""
    return ".lora_A." in name or ".lora_B." in name


def is_objective_adapter_key(name: str) -> bool:
    """Whether ``name`` is a tensor of an adapter an objective trains itself (a peft name
    other than ``ADAPTER``): not the stage's optimizer's, not the stage's exported adapter."""
    return _OBJECTIVE_INFIX.search(name) is not None


def is_stage_adapter_key(name: str) -> bool:
    """Whether ``name`` is a tensor of the stage's own adapter (what it exports and the next
    stage merges), not of an objective's."""
    return is_adapter_key(name) and not is_objective_adapter_key(name)


def released_name(name: str) -> str:
    """A module state-dict name in released terms: ``X.base_layer.weight`` -> ``X.weight``,
    ``X.lora_A.default.weight`` -> ``X.lora_A.weight``; other names unchanged."""
    return _PEFT_INFIX.sub(r".\1.", name.replace(".base_layer.", "."))


def base_names(names) -> dict[str, str]:
    """{released name: module name} for the non-adapter entries of ``names`` (state-dict
    keys of a module that may carry adapters)."""
    return {released_name(n): n for n in names if not is_adapter_key(n)}


def adapter_tensors(state: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """The stage's adapter entries of ``state`` under ``prefix`` (e.g. ``"model.dit."``), in
    released names without the prefix: ``blocks.0.attn.wq.lora_A.weight`` -> A [rank, in];
    an objective's adapters (:func:`is_objective_adapter_key`) are left out."""
    return {
        released_name(k.removeprefix(prefix)): v
        for k, v in state.items()
        if k.startswith(prefix) and is_stage_adapter_key(k)
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
    "adapter_in_use",
    "adapter_tensors",
    "apply_lora",
    "base_names",
    "checkpoint_options",
    "is_adapter_key",
    "is_objective_adapter_key",
    "is_stage_adapter_key",
    "merge_into",
    "released_name",
    "reset_lora",
    "target_modules",
]
