"""An exponential moving average of a stage's trainable weights.

Two users: a stage's ``ema_decay`` (the stage's result is the average of its last
~1 / (1 - decay) steps' weights instead of the last step's: the usual EMA of diffusion
trainers, which smooths the step-to-step noise of small batches and RL updates), and the
RL objective's DiffusionNFT old policy (:mod:`krea2.rl.online.old_policy`). The average
covers the trainable parameters only (a LoRA stage's adapters), plain tensors or DTensors
(each rank averages its own shards), so it costs one more copy of what the optimizer
already holds twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


class WeightEma:
    """The EMA ``avg = decay · avg + (1 - decay) · θ`` of ``params``, starting at their
    current values."""

    def __init__(self, params: list[Tensor]) -> None:
        self.params = list(params)
        with torch.no_grad():
            self.old = [p.detach().clone() for p in self.params]
        self._saved: list[Tensor] | None = None  # the trained weights while swapped out

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """One soft update towards the current weights (decay 0: avg = θ)."""
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay={decay} must be in [0, 1)")
        for o, p in zip(self.old, self.params, strict=True):
            o.lerp_(p.detach(), 1.0 - decay)

    @torch.no_grad()
    def copy_to_params(self) -> None:
        """Overwrite the trained weights with the average (a stage's end)."""
        for p, o in zip(self.params, self.old, strict=True):
            p.detach().copy_(o)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run the module with the averaged weights in place of the trained ones (no grad
        through them), restored bit for bit afterwards. The trained weights wait in one
        buffer kept across calls: DiffusionNFT swaps once per micro-batch, and a fresh copy
        of the trainable weights each time would be an allocation in its hot loop."""
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
            raise ValueError(f"EMA state has {len(state)} tensors, expected {len(self.old)}")
        with torch.no_grad():
            for i, o in enumerate(self.old):
                o.copy_(state[str(i)])
