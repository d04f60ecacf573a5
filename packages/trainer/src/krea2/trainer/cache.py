"""An in-memory cache of frozen-encoder outputs (latents by sample key), least recent out."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor


class LatentCache:
    """Latents of up to ``capacity`` samples, kept on CPU; ``capacity = 0`` disables it.

    Only for frozen, deterministic encoders (``encode(sample=False)``): a cached latent
    must equal a fresh one, or resuming would change the run.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._store: OrderedDict[str, Tensor] = OrderedDict()
        self.hits = self.misses = 0

    def encode(self, keys: list[str], pixels: Tensor, encode: Callable[[Tensor], Tensor]) -> Tensor:
        """Latents [B, C, h, w] of ``pixels`` [B, 3, H, W]; encodes only the missing rows."""
        if self.capacity == 0:
            return encode(pixels)
        missing = [i for i, k in enumerate(keys) if k not in self._store]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            fresh = encode(pixels[missing])
            for j, i in enumerate(missing):
                self._store[keys[i]] = fresh[j].detach().cpu()
        for k in keys:
            self._store.move_to_end(k)
        out = torch.stack([self._store[k] for k in keys]).to(pixels.device)
        while len(self._store) > self.capacity:
            self._store.popitem(last=False)
        return out
