"""Per-block activation checkpointing (full or selective) for the trainer to switch on."""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

AC_MODES = (None, "full", "selective")

# Ops whose outputs the selective policy keeps: the matmuls and attention (expensive to
# recompute); everything elementwise (norms, RoPE, gates, SiLU) is recomputed in backward.
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def run_block(block: nn.Module, mode: str | None, *args):
    """Call block(*args) with no checkpointing, full recomputation, or the selective policy."""
    if mode is None or not torch.is_grad_enabled():
        return block(*args)
    if mode == "full":
        return checkpoint(block, *args, use_reentrant=False)
    if mode == "selective":
        ctx_fn = functools.partial(create_selective_checkpoint_contexts, _policy)
        return checkpoint(block, *args, use_reentrant=False, context_fn=ctx_fn)
    raise ValueError(f"activation checkpointing mode {mode!r}; choose one of {AC_MODES}")


def set_activation_checkpointing(model: nn.Module, mode: str | None) -> None:
    """Turn per-block checkpointing of a Krea2DiT on ("full", "selective") or off (None)."""
    from krea2.infra.errors import UserError

    if mode not in AC_MODES:
        raise UserError(f"activation checkpointing mode {mode!r}; choose one of {AC_MODES}")
    model.checkpointing = mode
