"""The aesthetic reward: a scalar head trained on preference pairs with a Bradley-Terry loss.

Pairs come as (winner images, loser images), e.g. the pairs table of
``krea2.rl.preference``; the head learns ``f`` with ``P(w ≻ l) = σ(f(w) − f(l))``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from krea2.rl.rewards.contract import RewardOutput, as_uint8_images
from krea2.rl.rewards.features import FEATURE_NAMES, image_features
from krea2.rl.rewards.head import HeadReward, MlpHead, fit_bradley_terry


class AestheticReward(HeadReward):
    """Score = the head's logit ``f(image)`` (unbounded; differences are log-odds of
    preference); sub-score ``p_over_median``: ``σ(f − median f of the training images)``,
    in [0, 1]. Prompts are checked but not used."""

    name = "aesthetic"
    sub_scores = ("p_over_median",)

    def __init__(self, head: MlpHead) -> None:
        super().__init__(head)
        self._center = float(head.meta.get("median_logit", 0.0))

    def from_logits(self, logits: np.ndarray) -> RewardOutput:
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
    return AestheticReward.fitted(head, path)
