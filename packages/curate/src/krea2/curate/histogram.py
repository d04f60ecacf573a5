"""256-bin histograms of uint8 images that stay fast on flat images.

``cv2.calcHist`` adds one to a bin per pixel; on a flat region every pixel hits the same
bin, so each add waits for the previous one (store-to-load latency): a ShapesWorld frame
histograms ~3.5× slower than noise. Pairing each value with its column mod ``PHASES``
spreads neighbours over ``PHASES`` bins, which the CPU updates in parallel; the bins are
summed back afterwards. Counts are exact: calcHist counts in float32, so images of 2^24
pixels or more are counted by ``np.bincount`` instead.
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np

PHASES = 4
_RANGES = [0, 256, 0, PHASES]


@lru_cache(maxsize=16)
def phase_plane(h: int, w: int) -> np.ndarray:
    """(h, w) uint8 column index mod ``PHASES`` (read-only, cached per size)."""
    plane = np.ascontiguousarray(
        np.broadcast_to(np.arange(w, dtype=np.uint8) % PHASES, (h, w)), dtype=np.uint8
    )
    plane.setflags(write=False)
    return plane


@lru_cache(maxsize=16)
def _alpha_mask(h: int, w: int) -> np.ndarray:
    """(h, w, 4) uint8: 255 in R, G, B and the column phase in the fourth channel."""
    mask = np.full((h, w, 4), 255, np.uint8)
    mask[..., 3] = phase_plane(h, w)
    mask.setflags(write=False)
    return mask


EXACT_FLOAT32 = 1 << 24  # calcHist's float32 counts are exact below this many pixels


def with_phase(rgba: np.ndarray) -> np.ndarray:
    """(h, w, 4) uint8 RGBx → the same array with x = column phase (written in place)."""
    h, w = rgba.shape[:2]
    return cv2.bitwise_and(rgba, _alpha_mask(h, w), dst=rgba)


def channel_histograms_rgbp(rgbp: np.ndarray) -> np.ndarray:
    """(h, w, 4) uint8 RGB + phase (``with_phase``) → (3, 256) float64 counts per channel."""
    if rgbp.shape[0] * rgbp.shape[1] >= EXACT_FLOAT32:
        return np.stack(
            [np.bincount(rgbp[..., c].ravel(), minlength=256) for c in range(3)]
        ).astype(np.float64)
    return np.stack(
        [cv2.calcHist([rgbp], [c, 3], None, [256, PHASES], _RANGES).sum(axis=1) for c in range(3)]
    ).astype(np.float64)


def index_histogram(index: np.ndarray, phase: np.ndarray | None = None) -> np.ndarray:
    """(h, w) uint8 → (256,) float64 counts. ``phase``: its ``phase_plane`` if at hand."""
    h, w = index.shape
    if h * w >= EXACT_FLOAT32:
        return np.bincount(index.ravel(), minlength=256).astype(np.float64)
    phase = phase_plane(h, w) if phase is None else phase
    pair = cv2.merge([np.ascontiguousarray(index), phase])
    return cv2.calcHist([pair], [0, 1], None, [256, PHASES], _RANGES).sum(axis=1, dtype=np.float64)
