"""gpu.py's ``attention`` part: the attention kernel alone at the release's shape, per SDPA
backend (``krea2.dit.set_attention_backend``), with and without a key mask.

q [1, 48, L, 128] and k/v [1, 12, L, 128] in bf16 (GQA 48/12, head_dim 128: krea2-12b),
L = (side / 16)² image tokens + 512 text tokens; forward + backward of ``sdpa_gqa``, the
median of ``repeat`` calls. The masked rows mask the last 64 text tokens (padding), the
layout a batch of captions of different lengths gives; a kernel that cannot take the mask
(flash) records its error instead of a time, which is the point: ``auto`` silently falls
back to a slower kernel there.
"""

from __future__ import annotations

import statistics
import time

import torch

BACKENDS = ("auto", "cudnn", "flash", "efficient")
HEADS, KV_HEADS, HEAD_DIM, TEXT = 48, 12, 128, 512


def attention_kernels(device: torch.device, side: int, repeat: int) -> list[dict]:
    """One row per (backend, masked): ``ms`` (forward + backward) or ``error``. Runs on
    the CPU too (where only auto, flash and math exist), at a small ``side``."""
    length = (side // 16) ** 2 + TEXT
    g = torch.Generator(device).manual_seed(0)

    def tensor(heads: int) -> torch.Tensor:
        x = torch.randn(1, heads, length, HEAD_DIM, device=device, generator=g)
        return x.to(torch.bfloat16).requires_grad_(True)

    q, k, v = tensor(HEADS), tensor(KV_HEADS), tensor(KV_HEADS)
    valid = torch.ones(1, 1, 1, length, dtype=torch.bool, device=device)
    valid[..., TEXT - 64 : TEXT] = False
    rows = []
    for backend in BACKENDS:
        for mask in (None, valid):
            row: dict = {"backend": backend, "masked": mask is not None, "tokens": length}
            try:
                row["ms"] = 1e3 * _median_s(lambda b=backend, m=mask: _step(q, k, v, m, b),
                                            device, repeat)  # fmt: skip
            except RuntimeError as exc:  # this kernel cannot run this call
                row["error"] = str(exc).splitlines()[0][:160]
            rows.append(row)
    return rows


def _step(q, k, v, mask, backend: str) -> None:
    from krea2.dit.attention import sdpa_gqa

    out = sdpa_gqa(q, k, v, mask, backend)
    out.float().square().mean().backward()
    q.grad = k.grad = v.grad = None


def _median_s(step, device: torch.device, repeat: int) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()  # warm-up: kernel selection and workspace
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def markdown_rows(rows: list[dict]) -> list[list[str]]:
    """Table rows: backend, key mask, ms (or the kernel's refusal)."""
    return [[r["backend"], "yes" if r["masked"] else "no",
             f"{r['ms']:.2f}" if "ms" in r else f"— ({r.get('error', '?')})"]
            for r in rows]  # fmt: skip
