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
    if mode is BaseQuant.NONE:
        return
    if distributed:
        raise UserError(
            f"model.base_quant={mode.value!r} runs on one device only (torchao's quantized "
            "weights are not sharded by FSDP here); run on one GPU or set base_quant = 'none' "
            "(FSDP stores the sharded base and gathers it in bf16)"
        )
    if mode is BaseQuant.FLOAT8:
        ok = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
        if not ok:
            where = "a CPU" if device.type != "cuda" else "this GPU"
            raise UserError(
                f"model.base_quant='float8' needs a CUDA GPU with float8 support (compute "
                f"capability 8.9+: L40, H100, H200, B200); this run is on {where}. Use "
                "base_quant = 'int8' (CPU or GPU) or 'none'"
            )


def _frozen_block_linear(module: nn.Module, fqn: str) -> bool:
    return (
        isinstance(module, nn.Linear)
        and fqn.startswith("blocks.")
        and ".lora_" not in fqn
        and not module.weight.requires_grad
    )


def quantize_base(dit: nn.Module, mode: BaseQuant, device: torch.device) -> int:
    """Quantize ``dit``'s frozen block Linears in place (after the base weights are
    loaded); returns how many. Nothing for ``BaseQuant.NONE``."""
    if mode is BaseQuant.NONE:
        return 0
    check_base_quant(mode, device, distributed=False)
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    names = [n for n, m in dit.named_modules() if _frozen_block_linear(m, n)]
    if not names:
        raise UserError("model.base_quant: the DiT has no frozen block Linear to quantize")
    config = Int8WeightOnlyConfig() if mode is BaseQuant.INT8 else Float8WeightOnlyConfig()
    quantize_(dit, config, filter_fn=_frozen_block_linear)
    for name, m in dit.named_modules():  # torchao's new weights are Parameters again
        if name in names:
            m.weight.requires_grad_(False)
    log.info("frozen base: %d block Linears stored as %s (torchao)", len(names), mode.value)
    return len(names)


def base_bytes(dit: nn.Module, prefix: str = "") -> int:
    """Bytes of the DiT's frozen parameters whose names start with ``prefix``, as stored
    (quantized ones at their int8 / float8 size plus scales)."""
    total = 0
    for name, p in dit.named_parameters():
        if p.requires_grad or not name.startswith(prefix):
            continue
        data = getattr(p, "data", p)
        inner = [getattr(data, a) for a in getattr(data, "__tensor_flatten__", lambda: ([],))()[0]]
        parts = inner or [data]
        total += sum(t.numel() * t.element_size() for t in parts)
    return total
