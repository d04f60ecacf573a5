"""Loss and grad-norm spike detection against running statistics, plus the NaN guard."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from krea2.trainer.config import StabilityConfig


@dataclass
class Verdict:
    ok: bool
    reason: str = ""  # "nan", "loss_spike", "grad_spike"


class SpikeDetector:
    """Judges each step's (loss, grad norm) against the last ``window`` clean steps.

    A non-finite value is always bad. After ``warmup_steps`` clean steps, a loss above
    mean + ``loss_sigma`` * std, or a grad norm above ``grad_factor`` * mean, is a spike.
    Bad steps do not enter the statistics. The state is JSON data, saved in checkpoints
    so a resumed run judges exactly as an uninterrupted one. With ``spikes`` False only
    non-finite steps are bad (a preference or RL loss moves by design).
    """

    def __init__(self, cfg: StabilityConfig, spikes: bool = True) -> None:
        self.cfg = cfg
        self.spikes = spikes
        self.losses: deque[float] = deque(maxlen=cfg.window)
        self.grads: deque[float] = deque(maxlen=cfg.window)
        self.clean = 0
        self.consecutive_bad = 0

    def judge(self, loss: float, grad_norm: float) -> Verdict:
        verdict = self._judge(loss, grad_norm)
        if verdict.ok:
            self.losses.append(loss)
            self.grads.append(grad_norm)
            self.clean += 1
            self.consecutive_bad = 0
        else:
            self.consecutive_bad += 1
        return verdict

    def _judge(self, loss: float, grad_norm: float) -> Verdict:
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return Verdict(False, "nan")
        if not self.spikes or self.clean < self.cfg.warmup_steps or len(self.losses) < 2:
            return Verdict(True)
        n = len(self.losses)
        mean = sum(self.losses) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in self.losses) / (n - 1))
        if loss > mean + self.cfg.loss_sigma * max(std, 1e-3 * abs(mean)):
            return Verdict(False, "loss_spike")
        gmean = sum(self.grads) / len(self.grads)
        if grad_norm > self.cfg.grad_factor * gmean:
            return Verdict(False, "grad_spike")
        return Verdict(True)

    def state_dict(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses),
            "grads": list(self.grads),
            "clean": self.clean,
            "consecutive_bad": self.consecutive_bad,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses = deque(state["losses"], maxlen=self.cfg.window)
        self.grads = deque(state["grads"], maxlen=self.cfg.window)
        self.clean = state["clean"]
        self.consecutive_bad = state["consecutive_bad"]
