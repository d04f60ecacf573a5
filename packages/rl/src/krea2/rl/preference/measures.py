"""Drift measures of a model's samples: high-frequency energy, the report's symptom of a
preference-tuned model leaving the pretraining distribution; and the same measure as a
model-agnostic reward (:class:`SmoothnessReward`) that ranks even a barely trained model's
samples, for smoke runs and the docs' walkthrough."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def high_frequency_shares(images: np.ndarray, cutoff: float = 0.5) -> np.ndarray:
    """Per image, float64 [B]: the share (0..1) of the spectral energy of the mean-removed
    luminance at spatial frequencies above ``cutoff`` x Nyquist; ``images`` uint8
    [B, H, W, 3]. A drifting model's samples gain speckle and ringing, which raises it."""
    # C order first: numpy's reductions keep the input's memory layout, so a strided view
    # (a sampler's channels-last permute) would sum in another order than its saved copy.
    x = np.ascontiguousarray(images, dtype=np.float64) / 255.0
    lum = x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114  # no BLAS: no kernel choice
    lum = lum - lum.mean(axis=(1, 2), keepdims=True)
    power = np.abs(np.fft.fft2(lum)) ** 2
    fy = np.abs(np.fft.fftfreq(lum.shape[1]))[:, None] * 2  # 1 = Nyquist
    fx = np.abs(np.fft.fftfreq(lum.shape[2]))[None, :] * 2
    high = np.maximum(fy, fx) > cutoff
    total = power.sum(axis=(1, 2))
    return (power * high).sum(axis=(1, 2)) / np.maximum(total, 1e-12)


def high_frequency_energy(images: np.ndarray, cutoff: float = 0.5) -> float:
    """:func:`high_frequency_shares` averaged over ``images`` uint8 [B, H, W, 3]."""
    return float(high_frequency_shares(images, cutoff).mean())


class SmoothnessReward:
    """Score = 1 − the image's high-frequency energy share (0..1, higher is smoother);
    sub-score ``hf_energy``: the share itself. It ignores the prompt, so it ranks any
    model's samples (an untrained one's included): a cheap stand-in for a real reward when
    checking the pairs → shards → preference-training path (``krea2 rl make-pairs
    --reward smooth``), and a preference against speckle."""

    name = "smooth"

    def __call__(self, images: Any, prompts: Sequence[str]) -> Any:
        from krea2.rl.rewards import RewardOutput, check_batch

        pixels, _ = check_batch(images, prompts)
        if len(pixels) == 0:
            return RewardOutput(np.zeros(0, np.float32), {"hf_energy": np.zeros(0, np.float32)})
        shares = high_frequency_shares(pixels)
        return RewardOutput(1.0 - shares, {"hf_energy": shares})
