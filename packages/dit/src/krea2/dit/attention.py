"""Gated grouped-query self-attention with QK-RMSNorm before RoPE."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from krea2.dit.config import ATTENTION_BACKENDS
from krea2.dit.layers import RMSNorm
from krea2.dit.rope import apply_rope


class QKNorm(nn.Module):
    """Separate RMSNorms over head_dim for queries and keys (keys `qnorm`, `knorm`)."""

    def __init__(self, head_dim: int, eps: float) -> None:
        super().__init__()
        self.qnorm = RMSNorm(head_dim, eps)
        self.knorm = RMSNorm(head_dim, eps)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.qnorm(q), self.knorm(k)


_CUDA_ONLY = ("cudnn", "efficient")
# ATTENTION_BACKENDS' pinned kernels by their torch.nn.attention.SDPBackend member names
_KERNELS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
            "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}  # fmt: skip


class Attention(nn.Module):
    """Self-attention: q/k/v/gate projections of the same input, GQA, `wo(attn * sigmoid(gate))`.

    Head counts are read from the projection outputs (`unflatten(-1, (-1, head_dim))`) so the
    same code runs on tensor-parallel shards that hold a contiguous slice of the heads.
    """

    def __init__(self, dim: int, heads: int, kv_heads: int, eps: float, gate: bool = True) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.gate = nn.Linear(dim, heads * self.head_dim, bias=False) if gate else None
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.qknorm = QKNorm(self.head_dim, eps)
        self.backend = "auto"  # the SDPA kernel (set_attention_backend)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        q_start: int = 0,
    ) -> Tensor:
        """x [B, L, D] -> [B, L - q_start, D]: every token is a key, queries are x[:, q_start:].

        rope (cos, sin) [B|1, L, R/2]; mask [B, 1, 1, L]: bool (True = key valid) or additive
        float in x's dtype (added to the logits; -inf = key masked).
        """
        hd = self.head_dim
        xq = x[:, q_start:] if q_start else x
        q = self.wq(xq).unflatten(-1, (-1, hd))
        k = self.wk(x).unflatten(-1, (-1, hd))
        v = self.wv(x).unflatten(-1, (-1, hd))
        q, k = self.qknorm(q, k)
        if rope is not None:
            cos, sin = rope
            q = apply_rope(q, cos[:, q_start:], sin[:, q_start:])
            k = apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = sdpa_gqa(q, k, v, mask, self.backend).transpose(1, 2).flatten(2)
        if self.gate is not None:
            out = out * torch.sigmoid(self.gate(xq))
        return self.wo(out)


def set_attention_backend(model: nn.Module, backend: str) -> None:
    """Pin the SDPA kernel of every attention in ``model``: ``auto`` (PyTorch picks per
    call, the default), ``cudnn``, ``flash``, ``efficient`` (CUDA only) or ``math``. A pinned
    kernel that cannot run a call (flash with a key mask, cuDNN on a card or dtype it does
    not support) fails that call with PyTorch's reason instead of silently running a slower
    one, so a benchmark measures the kernel it names."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention backend {backend!r}: choose one of {', '.join(ATTENTION_BACKENDS)}"
        )
    for m in model.modules():
        if isinstance(m, Attention):
            m.backend = backend


def sdpa_kernel_for(backend: str, device: torch.device) -> AbstractContextManager:
    """The context that pins ``backend``'s SDPA kernel for a call on ``device``."""
    if backend == "auto":
        return nullcontext()
    if backend in _CUDA_ONLY and device.type != "cuda":
        raise RuntimeError(
            f"attention backend {backend!r} runs only on CUDA; on {device.type} use auto, "
            "flash or math"
        )
    return sdpa_kernel([getattr(SDPBackend, _KERNELS[backend])])


def sdpa_gqa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, backend: str = "auto") -> Tensor:
    """SDPA where query head j uses KV head j // (H / KV). q [B, H, L, hd], k/v [B, KV, L, hd].

    mask [B, 1, 1, L]: bool (True = key valid) or additive float in q's dtype. ``backend``:
    the SDPA kernel (:data:`ATTENTION_BACKENDS`; ``auto``: PyTorch's choice).

    On CUDA with a mask, KV heads are repeated: the fused kernels that take a mask do not all
    take `enable_gqa`, and the math fallback would materialise [B, H, L, L]. Elsewhere
    (CPU, or no mask) `enable_gqa` avoids the copy.
    """
    groups = q.shape[1] // k.shape[1]
    if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
        # An additive mask built in the model's dtype meets bf16 queries under autocast;
        # SDPA takes a float mask only in the query's dtype.
        mask = mask.to(q.dtype)
    if groups > 1 and mask is not None and q.is_cuda:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        groups = 1
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # PyTorch's CPU flash kernel is ~3x slower in bf16 than in fp32 (backward above
        # all, measured on avx512_bf16), so bf16 autocast on CPU keeps attention in fp32.
        if mask is not None and mask.is_floating_point():
            mask = mask.float()
        with torch.autocast("cpu", enabled=False), sdpa_kernel_for(backend, q.device):
            out = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=groups > 1
            )
        return out.to(q.dtype)
    with sdpa_kernel_for(backend, q.device):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=groups > 1)
