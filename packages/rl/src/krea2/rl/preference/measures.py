"""Drift measures of a model's samples: high-frequency energy, the report's symptom of a
preference-tuned model leaving the pretraining distribution."""

from __future__ import annotations

import numpy as np


def high_frequency_energy(images: np.ndarray, cutoff: float = 0.5) -> float:
    """Share of the spectral energy (mean-removed luminance) at spatial frequencies above
    ``cutoff`` x Nyquist, averaged over ``images`` uint8 [B, H, W, 3]. A drifting model's
    samples gain speckle and ringing, which raises it."""
    x = images.astype(np.float64) / 255.0
    lum = x @ np.array([0.299, 0.587, 0.114])
    lum = lum - lum.mean(axis=(1, 2), keepdims=True)
    power = np.abs(np.fft.fft2(lum)) ** 2
    fy = np.abs(np.fft.fftfreq(lum.shape[1]))[:, None] * 2  # 1 = Nyquist
    fx = np.abs(np.fft.fftfreq(lum.shape[2]))[None, :] * 2
    high = np.maximum(fy, fx) > cutoff
    total = power.sum(axis=(1, 2))
    share = (power * high).sum(axis=(1, 2)) / np.maximum(total, 1e-12)
    return float(share.mean())
