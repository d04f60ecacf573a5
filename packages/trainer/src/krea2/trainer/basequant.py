"""A LoRA stage's frozen base in int8 or float8 (torchao weight-only), for low memory.

The block Linears that are frozen (peft's ``base_layer`` of each adapted Linear, and any
untargeted one) get torchao weight-only tensors after the base weights are loaded: int8
per output channel (``Int8WeightOnlyConfig``: about a quarter of fp32's bytes, CPU and
GPU) or float8 e4m3 (``Float8WeightOnlyConfig``, CUDA with compute capability 8.9+). The
matmul dequantizes on the fly, so gradients still flow through the base to the adapters
of earlier layers; the adapters and everything outside the blocks keep their dtype.
Checkpoints hold only the adapters, and resume loads and quantizes the base again, so
a resumed run is still exact. One device only: FSDP2 would shard torchao's tensor
subclasses through its all-gather extension, which is not wired here.
"""

from __future__ import annotations

import torch
from torch import nn

from krea2.infra.errors import UserError
from krea2.infra.logging import get_logger
from krea2.trainer.choices import BaseQuant

log = get_logger("trainer")


def check_base_quant(mode: BaseQuant, device: torch.device, distributed: bool) -> None:
    """UserError when ``mode`` cannot run on ``device`` / under FSDP, before any weight
    is read."""
    from krea2.dit.weight_quant import check_weight_quant

    if mode is BaseQuant.NONE:
        return
    if distributed:
        raise UserError(
            f"model.base_quant={mode.value!r} runs on one device only (torchao's quantized "
            "weights are not sharded by FSDP here); run on one GPU or set base_quant = 'none' "
            "(FSDP stores the sharded base and gathers it in bf16)"
        )
    check_weight_quant(mode.value, device, "model.base_quant")


def _frozen(module: nn.Module, fqn: str) -> bool:
    return ".lora_" not in fqn and not module.weight.requires_grad


def quantize_base(dit: nn.Module, mode: BaseQuant, device: torch.device) -> int:
    """Quantize ``dit``'s frozen block Linears in place (after the base weights are
    loaded; :func:`krea2.dit.weight_quant.quantize_block_linears`); returns how many.
    Nothing for ``BaseQuant.NONE``."""
    from krea2.dit.weight_quant import quantize_block_linears

    if mode is BaseQuant.NONE:
        return 0
    names = quantize_block_linears(dit, mode.value, device, _frozen, "model.base_quant")
    log.info("frozen base: %d block Linears stored as %s (torchao)", len(names), mode.value)
    return len(names)


def base_bytes(dit: nn.Module, prefix: str = "") -> int:
    """Bytes of the DiT's frozen parameters whose names start with ``prefix``, as stored
    (quantized ones at their int8 / float8 size plus scales)."""
    from krea2.dit.weight_quant import stored_bytes

    return stored_bytes(dit, prefix, frozen_only=True)
