"""The aesthetic reward: a scalar head trained on preference pairs with a Bradley-Terry loss.

Pairs come as (winner images, loser images), e.g. the pairs table of
``krea2.rl.preference``; the head learns ``f`` with ``P(w ≻ l) = σ(f(w) − f(l))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from krea2.rl.rewards.contract import RewardOutput, as_uint8_images, check_batch, empty_output
from krea2.rl.rewards.features import FEATURE_NAMES, image_features
from krea2.rl.rewards.head import MlpHead, fit_bradley_terry


class AestheticReward:
    """Score = the head's logit ``f(image)`` (unbounded; differences are log-odds of
    preference); sub-score ``p_over_median``: ``σ(f − median f of the training images)``,
    in [0, 1]. Prompts are checked but not used."""

    name = "aesthetic"

    def __init__(self, head: MlpHead) -> None:
        self.head = head
        self._center = float(head.meta.get("median_logit", 0.0))

    @classmethod
    def load(cls, path: str | Path) -> AestheticReward:
        return cls(MlpHead.load(path))

    def save(self, path: str | Path) -> Path:
        return self.head.save(path)

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        if not prompts:
            return empty_output(("p_over_median",))
        logits = self.head.logits(image_features(pixels))
        return RewardOutput(logits, {"p_over_median": 1.0 / (1.0 + np.exp(self._center - logits))})


def preference_accuracy(reward: AestheticReward, winners: Any, losers: Any) -> float:
    """Share of pairs where the reward scores the winner above the loser."""
    w, l_ = as_uint8_images(winners), as_uint8_images(losers)
    prompts = ["pair"] * len(w)
    return float((reward(w, prompts).scores > reward(l_, prompts).scores).mean())


def train_aesthetic_reward(
    winners: Any,
    losers: Any,
    *,
    path: str | Path | None = None,
    epochs: int = 300,
    seed: int = 0,
) -> AestheticReward:
    """Fit the Bradley-Terry head on pairs: ``winners[i]`` was preferred over ``losers[i]``
    (each a batch in the contract's image convention; they may differ in size from each
    other). Saves to ``path`` when given."""
    w, l_ = as_uint8_images(winners), as_uint8_images(losers)
    if len(w) != len(l_) or len(w) == 0:
        raise ValueError(f"need as many winners as losers (≥ 1), got {len(w)} and {len(l_)}")
    fw, fl = image_features(w), image_features(l_)
    head = fit_bradley_terry(
        fw,
        fl,
        epochs=epochs,
        seed=seed,
        meta={"kind": "aesthetic", "features": list(FEATURE_NAMES), "pairs": len(w)},
    )
    head.meta["median_logit"] = float(np.median(head.logits(np.concatenate([fw, fl]))))
    reward = AestheticReward(head)
    if path is not None:
        reward.save(path)
    return reward
