"""Weight-only quantization of the DiT's block Linears with torchao, for sampling and for a
LoRA stage's frozen base (`krea2.trainer` calls it with its own filter).

``int8``: per-output-channel int8 weights with fp scales (``Int8WeightOnlyConfig``), about a
quarter of fp32's bytes (half of bf16's), on CPU and GPU. ``float8``: e4m3 weights
(``Float8WeightOnlyConfig``), CUDA with compute capability 8.9+ (L40, H100, H200, B200).
The matmul dequantizes on the fly; activations, norms, embeddings and everything outside
the blocks keep their dtype (the block Linears hold 94.8 % of krea2-12b's parameters:
12.16 of 12.82 B, counted on the meta device). Needs torchao (`pip install 'krea2-dit[quant]'`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from krea2.infra.errors import UserError

__all__ = [
    "WEIGHT_QUANTS",
    "check_weight_quant",
    "float8_supported",
    "quantize_block_linears",
    "stored_bytes",
]

WEIGHT_QUANTS = ("none", "int8", "float8")


def check_weight_quant(mode: str, device: torch.device | str, what: str = "--quant") -> None:
    """UserError (naming ``what``, the setting that asked) when ``mode`` is unknown, cannot
    run on ``device`` or torchao is missing; before any weight is read."""
    if mode not in WEIGHT_QUANTS:
        raise UserError(f"{what}={mode!r}: choose one of {', '.join(WEIGHT_QUANTS)}")
    if mode == "none":
        return
    device = torch.device(device)
    if mode == "float8" and not float8_supported(device):
        where = "a CPU" if device.type != "cuda" else "this GPU"
        raise UserError(
            f"{what}='float8' needs a CUDA GPU with float8 support (compute capability "
            f"8.9+: L40, H100, H200, B200); this is {where}. Use int8 (CPU or GPU) or none"
        )
    try:
        import torchao  # noqa: F401
    except ImportError:
        raise UserError(
            f"{what}={mode!r} needs torchao; install it with: pip install 'krea2-dit[quant]'"
        ) from None


def float8_supported(device: torch.device | str) -> bool:
    """Whether ``device`` runs float8 weight-only matmuls (CUDA, compute capability 8.9+)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _block_linear(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear) and fqn.startswith("blocks.")


def quantize_block_linears(
    net: nn.Module,
    mode: str,
    device: torch.device | str,
    keep: Callable[[nn.Module, str], bool] | None = None,
    what: str = "--quant",
) -> list[str]:
    """Quantize ``net``'s block Linears (those ``keep(module, fqn)`` also accepts) in place,
    after its weights are loaded; returns their names (none for ``mode="none"``). The
    quantized weights do not require gradients. UserError as :func:`check_weight_quant`,
    or when no Linear qualifies."""
    check_weight_quant(mode, device, what)
    if mode == "none":
        return []

    def chosen(module: nn.Module, fqn: str) -> bool:
        return _block_linear(module, fqn) and (keep is None or keep(module, fqn))

    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    names = [n for n, m in net.named_modules() if chosen(m, n)]
    if not names:
        raise UserError(f"{what}={mode!r}: the DiT has no block Linear to quantize")
    config = Int8WeightOnlyConfig() if mode == "int8" else Float8WeightOnlyConfig()
    quantize_(net, config, filter_fn=chosen)
    chosen_names = set(names)
    for name, m in net.named_modules():  # torchao's new weights are Parameters again
        if name in chosen_names:
            m.weight.requires_grad_(False)
    return names


def stored_bytes(net: nn.Module, prefix: str = "", frozen_only: bool = False) -> int:
    """Bytes of ``net``'s parameters whose names start with ``prefix`` (only those that do
    not require gradients with ``frozen_only``), as stored: a quantized weight at its int8 /
    float8 size plus its scales."""
    total = 0
    for name, p in net.named_parameters():
        if (frozen_only and p.requires_grad) or not name.startswith(prefix):
            continue
        data = getattr(p, "data", p)
        inner = [getattr(data, a) for a in getattr(data, "__tensor_flatten__", lambda: ([],))()[0]]
        total += sum(t.numel() * t.element_size() for t in (inner or [data]))
    return total
