"""Pillow's LANCZOS resize of 8-bit grey, reproduced exactly with integer weight matrices.

imagehash's phash resizes with ``Image.resize(..., LANCZOS)``; to stay bit-identical we need
the same pixels, but Pillow's generic two-pass loop is most of the cost of a phash on the
256-px analysis pixels. Pillow computes, per output pixel, a window of Lanczos-3 weights
(normalised to sum 1, then rounded to fixed point with 22 fractional bits), accumulates
``Σ pixel · weight + 2^21`` in integers, shifts right by 22 and clips to 0..255, once per pass
(so the intermediate image is uint8). Here each pass is a matrix product over the same
integer weights, done in float64, which is exact: every partial sum is an integer below
2^31 < 2^53. The weights are banded, so each product runs over groups of output pixels and
touches only the inputs inside their window. Which pass runs first follows Pillow 13
(checked against Pillow on random sizes in ``tests/test_resample.py``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

PRECISION_BITS = 22  # Pillow's fixed-point fraction for 8-bit resampling: 32 - 8 - 2
SUPPORT = 3.0  # Lanczos-3
GROUP = 8  # output columns per banded product (measured: 8-12 is fastest at 256 → 32/48)


def _lanczos(x: float) -> float:
    def sinc(v: float) -> float:
        if v == 0.0:
            return 1.0
        v *= math.pi
        return math.sin(v) / v

    return sinc(x) * sinc(x / 3.0) if -SUPPORT <= x < SUPPORT else 0.0


@lru_cache(maxsize=64)
def pass_weights(in_size: int, out_size: int) -> np.ndarray:
    """(out_size, in_size) float64 matrix of Pillow's fixed-point weights (integers)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT * filterscale
    inverse = 1.0 / filterscale  # Pillow multiplies by the inverse; dividing rounds differently
    weights = np.zeros((out_size, in_size))
    for out in range(out_size):
        center = (out + 0.5) * scale
        # int() truncates toward zero, as Pillow's C cast does.
        lo = max(int(center - support + 0.5), 0)
        n = min(int(center + support + 0.5), in_size) - lo
        k = [_lanczos((x + lo - center + 0.5) * inverse) for x in range(n)]
        total = 0.0
        for w in k:  # sequential sum, as Pillow adds them
            total += w
        if total != 0.0:
            k = [w / total for w in k]
        one = 1 << PRECISION_BITS
        weights[out, lo : lo + n] = [int(w * one - 0.5) if w < 0 else int(w * one + 0.5) for w in k]
    weights.setflags(write=False)
    return weights


@lru_cache(maxsize=64)
def _bands(in_size: int, out_size: int) -> tuple[tuple[int, int, int, np.ndarray], ...]:
    """Groups of ``GROUP`` output columns: (first input, end input, first output, (span, g)
    weights) — the horizontal pass as a few small dense products instead of one wide one."""
    w = pass_weights(in_size, out_size).T  # (in, out)
    out = []
    for c0 in range(0, out_size, GROUP):
        block = w[:, c0 : c0 + GROUP]
        rows = np.nonzero(block.any(axis=1))[0]
        lo, hi = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 1)
        out.append((lo, hi, c0, np.ascontiguousarray(block[lo:hi])))
    return tuple(out)


def _round(acc: np.ndarray) -> np.ndarray:
    """Pillow's clip8: (acc + 2^21) >> 22, clipped to 0..255 (floor = arithmetic shift)."""
    half = float(1 << (PRECISION_BITS - 1))
    out = np.floor((acc + half) * (1.0 / (1 << PRECISION_BITS)))
    return np.clip(out, 0.0, 255.0, out=out)


def _horizontal(grey: np.ndarray, out_w: int) -> np.ndarray:
    out = np.empty((grey.shape[0], out_w))
    for lo, hi, c0, w in _bands(grey.shape[1], out_w):
        np.matmul(grey[:, lo:hi], w, out=out[:, c0 : c0 + w.shape[1]])
    return _round(out)


def _vertical(grey: np.ndarray, out_h: int) -> np.ndarray:
    # The same banded products on the transpose (a view): every product stays small enough
    # that OpenBLAS runs it on the calling thread.
    return _horizontal(grey.T, out_h).T


def vertical_first(h: int, w: int, out_h: int, out_w: int) -> bool:
    """Pillow 13's pass order: vertical first when it removes more than twice as many rows
    as the horizontal pass removes columns (an enlargement removes none)."""
    return h - out_h > max(0, 2 * (w - out_w))


def lanczos_resize(grey: np.ndarray, out_w: int, out_h: int) -> np.ndarray:
    """(h, w) uint8 or float64 grey → (out_h, out_w) uint8, equal to Pillow's
    ``Image.fromarray(grey).resize((out_w, out_h), Image.Resampling.LANCZOS)``."""
    h, w = grey.shape
    x = np.asarray(grey, dtype=np.float64)
    if vertical_first(h, w, out_h, out_w):
        x = _vertical(x, out_h)
        x = _horizontal(x, out_w) if out_w != w else x
    else:
        x = _horizontal(x, out_w) if out_w != w else x
        x = _vertical(x, out_h) if out_h != h else x
    return x.astype(np.uint8)
