"""DiffusionNFT's sampling ("old") policy: an exponential moving average of the trained
weights that rolls out the images and gives v_old in the loss.

With v_old the current weights (decay 0) the NFT gradient is 2β(2r - 1)(v_θ - target):
an advantage-weighted flow-matching step with nothing holding the policy back, so a
large learning rate walks it off (docs/rl.md, the proof's lr 6e-3 run). With v_old
lagging, the gradient gains 2β²(v_θ - v_old): a pull towards the sampling policy, a trust
region whose width the decay sets (Zheng et al. 2025 soft-update the old adapter the same
way). The average covers the trainable parameters only (a LoRA stage's adapters), so it
costs one more copy of what the optimizer already holds twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


class OldPolicy:
    """The EMA ``old = decay · old + (1 - decay) · θ`` of ``params`` (the stage's trainable
    parameters, plain tensors or DTensors), starting at their current values."""

    def __init__(self, params: list[Tensor]) -> None:
        self.params = list(params)
        with torch.no_grad():
            self.old = [p.detach().clone() for p in self.params]
        self._saved: list[Tensor] | None = None  # the trained weights while swapped out

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """One soft update towards the current weights (decay 0: old = θ)."""
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay={decay} must be in [0, 1)")
        for o, p in zip(self.old, self.params, strict=True):
            o.lerp_(p.detach(), 1.0 - decay)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run the module with the old weights in place of the trained ones (no grad
        through them), restored bit for bit afterwards. The trained weights wait in one
        buffer kept across calls: the NFT update swaps once per micro-batch, and a fresh
        copy of the trainable weights each time would be an allocation in its hot loop."""
        with torch.no_grad():
            if self._saved is None:
                self._saved = [torch.empty_like(p) for p in self.params]
            for p, o, s in zip(self.params, self.old, self._saved, strict=True):
                s.copy_(p.detach())
                p.detach().copy_(o)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, self._saved, strict=True):
                    p.detach().copy_(s)

    def state_dict(self) -> dict[str, Tensor]:
        """The averaged weights by position (what a checkpoint keeps)."""
        return {str(i): o for i, o in enumerate(self.old)}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if len(state) != len(self.old):
            raise ValueError(f"old policy state has {len(state)} tensors, expected {len(self.old)}")
        with torch.no_grad():
            for i, o in enumerate(self.old):
                o.copy_(state[str(i)])
