"""Caches of frozen-encoder outputs, keyed by the encoder's fingerprint: latents by sample
key and image size, text embeddings by caption. In memory (least recent out) and, with a
directory, on disk under ``DIR/<fingerprint>/`` so that later epochs, stages and runs of
the same encoder encode nothing; another encoder (other weights or shape) gets its own
directory and never reads a stale entry.

Only for frozen, deterministic encoders (``encode(sample=False)``, a text encoder in eval
mode): a cached output must equal a fresh one, or a resumed or cached run would change.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn


def module_fingerprint(module: nn.Module | object) -> str:
    """16 hex digits identifying a frozen module: its class, and per parameter and buffer
    the name, shape, dtype, sum and first 64 values (float64). An encoder with its own
    ``fingerprint()`` (``krea2.dit.text.TextEncoder``) is asked instead."""
    own = getattr(module, "fingerprint", None)
    if callable(own):
        return str(own())
    h = hashlib.sha256(f"{type(module).__module__}.{type(module).__qualname__}".encode())
    if isinstance(module, nn.Module):
        tensors = [*module.named_parameters(), *module.named_buffers()]
        for name, t in sorted(tensors, key=lambda nt: nt[0]):
            t = t.detach()
            h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            flat = t.flatten().to("cpu", torch.float64)
            h.update(flat.sum().numpy().tobytes() + flat[:64].numpy().tobytes())
    return h.hexdigest()[:16]


class EncoderCache:
    """Tensors by string key for one encoder (``fingerprint``): up to ``capacity`` in memory
    (CPU), and every entry on disk under ``root/<fingerprint>/`` when ``root`` is set.
    ``capacity = 0`` and no ``root``: disabled (every row is encoded)."""

    def __init__(self, fingerprint: str, capacity: int = 0, root: str | Path | None = None):
        self.fingerprint = fingerprint
        self.capacity = capacity
        self.root = Path(root) / fingerprint if root is not None else None
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
        self._mem: OrderedDict[str, tuple[Tensor, ...]] = OrderedDict()
        self.hits = self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0 or self.root is not None

    def _file(self, key: str) -> Path:
        assert self.root is not None
        return self.root / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.safetensors"

    def get(self, key: str) -> tuple[Tensor, ...] | None:
        if key in self._mem:
            self._mem.move_to_end(key)
            return self._mem[key]
        if self.root is not None and (path := self._file(key)).is_file():
            from safetensors.torch import load_file

            saved = load_file(str(path))
            value = tuple(saved[str(i)] for i in range(len(saved)))
            self._remember(key, value)
            return value
        return None

    def put(self, key: str, value: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Store ``value`` (moved to the CPU) under ``key``; returns the stored tensors."""
        value = tuple(v.detach().to("cpu").contiguous() for v in value)
        self._remember(key, value)
        if self.root is not None:
            from safetensors.torch import save_file

            path = self._file(key)
            tmp = path.with_suffix(f".tmp{torch.randint(1 << 30, ()).item()}")
            save_file({str(i): v for i, v in enumerate(value)}, str(tmp))
            tmp.replace(path)  # atomic: a reader sees the whole entry or none
        return value

    def _remember(self, key: str, value: tuple[Tensor, ...]) -> None:
        if self.capacity <= 0:
            return
        self._mem[key] = value
        self._mem.move_to_end(key)
        while len(self._mem) > self.capacity:
            self._mem.popitem(last=False)

    def lookup(
        self, keys: Sequence[str], encode: Callable[[list[int]], Sequence[tuple[Tensor, ...]]]
    ) -> list[tuple[Tensor, ...]]:
        """Per key its cached tensors, encoding the missing rows in one call:
        ``encode(indices into keys)`` returns one tuple of tensors per index."""
        found = {k: v for k in dict.fromkeys(keys) if (v := self.get(k)) is not None}
        self.hits += sum(1 for k in keys if k in found)
        missing = list(
            {k: i for i, k in reversed(list(enumerate(keys))) if k not in found}.values()
        )
        missing.sort()  # the first row of each missing key, encoded once
        self.misses += len(missing)
        if missing:
            for i, value in zip(missing, encode(missing), strict=True):
                found[keys[i]] = self.put(keys[i], value)
        return [found[k] for k in keys]


class LatentCache:
    """Latents by sample key and image size for the autoencoder ``fingerprint``: up to
    ``capacity`` in memory and all on disk under ``root`` (see :class:`EncoderCache`)."""

    def __init__(self, capacity: int, fingerprint: str = "", root: str | Path | None = None):
        self.store = EncoderCache(fingerprint or "latents", capacity, root)

    @property
    def hits(self) -> int:
        return self.store.hits

    @property
    def misses(self) -> int:
        return self.store.misses

    def encode(
        self, keys: list[str] | None, pixels: Tensor, encode: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """Latents [B, C, h, w] of ``pixels`` [B, 3, H, W]; encodes only the missing rows.
        ``keys`` None: images made for this step only (e.g. random style references),
        encoded and never cached."""
        if keys is None or not self.store.enabled:
            return encode(pixels)
        size = f"@{pixels.shape[-2]}x{pixels.shape[-1]}"
        rows = self.store.lookup(
            [k + size for k in keys], lambda idx: [(z,) for z in encode(pixels[idx])]
        )
        return torch.stack([r[0] for r in rows]).to(pixels.device)


def latent_cache(data_cfg, autoencoder: nn.Module) -> LatentCache:
    """The job's latent cache (``data_cfg``: DataConfig) for ``autoencoder``, keyed by its
    fingerprint (taken only when the cache is on: it reads every weight once)."""
    on = data_cfg.cache_latents > 0 or data_cfg.cache_dir is not None
    fp = module_fingerprint(autoencoder) if on else ""
    return LatentCache(data_cfg.cache_latents, fp, data_cfg.cache_dir)
