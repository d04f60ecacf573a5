"""Pillow's LANCZOS resize of 8-bit grey, reproduced exactly with integer weight matrices.

imagehash's phash resizes with ``Image.resize(..., LANCZOS)``; to stay bit-identical we need
the same pixels, but Pillow's generic two-pass loop is most of the cost of a phash on the
256-px analysis pixels. Pillow computes, per output pixel, a window of Lanczos-3 weights
(normalised to sum 1, then rounded to fixed point with 22 fractional bits), accumulates
``Σ pixel · weight + 2^21`` in integers, shifts right by 22 and clips to 0..255, once per pass
(so the intermediate image is uint8). Here the same integer weights and the same integer
arithmetic run in two compiled loops (numba), each output reading only its window; the
vertical pass sums whole rows, so its inner loop vectorises. Which pass runs first follows
Pillow 13 (checked against Pillow on random sizes in ``tests/test_resample.py``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import njit

PRECISION_BITS = 22  # Pillow's fixed-point fraction for 8-bit resampling: 32 - 8 - 2
SUPPORT = 3.0  # Lanczos-3


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
def _windows(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pass_weights`` as (out_size, in_size) int32 plus each output's input window
    [lo, hi) (int64): the span of its nonzero weights (zeros outside add nothing)."""
    w = pass_weights(in_size, out_size)
    nonzero = w != 0
    lo = np.where(nonzero.any(axis=1), nonzero.argmax(axis=1), 0)
    hi = np.where(nonzero.any(axis=1), in_size - nonzero[:, ::-1].argmax(axis=1), 0)
    out = w.astype(np.int32), lo.astype(np.int64), hi.astype(np.int64)
    for a in out:  # cached and shared: read-only (also the one type the kernels take)
        a.setflags(write=False)
    return out


@njit(cache=True, nogil=True)
def _rows_pass(src: np.ndarray, weights: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """(n, m) uint8 → (out, m) uint8: output row o is Σ_y weights[o, y] · src[y] over
    its window, then Pillow's clip8: (acc + 2^21) >> 22 clipped to 0..255. Whole rows at a
    time, so the inner loop vectorises; int32 as in Pillow (|acc| < 2^31 for 8-bit input)."""
    out_n, m = weights.shape[0], src.shape[1]
    out = np.empty((out_n, m), np.uint8)
    acc = np.empty(m, np.int32)
    for o in range(out_n):
        acc[:] = 1 << (PRECISION_BITS - 1)
        for y in range(lo[o], hi[o]):
            k = weights[o, y]
            for x in range(m):
                acc[x] += np.int32(src[y, x]) * k
        for x in range(m):
            out[o, x] = min(max(acc[x] >> PRECISION_BITS, 0), 255)
    return out


def vertical_first(h: int, w: int, out_h: int, out_w: int) -> bool:
    """Pillow 13's pass order: vertical first when it removes more than twice as many rows
    as the horizontal pass removes columns (an enlargement removes none)."""
    return h - out_h > max(0, 2 * (w - out_w))


@lru_cache(maxsize=64)
def plan(h: int, w: int, out_h: int, out_w: int) -> tuple:
    """Everything ``lanczos_t`` needs for an (h, w) → (out_h, out_w) resize besides the
    pixels: the horizontal and vertical ``_windows`` and Pillow's pass order."""
    return (*_windows(w, out_w), *_windows(h, out_h), vertical_first(h, w, out_h, out_w))


@njit(cache=True, nogil=True)
def lanczos_t(xt, h_weights, h_lo, h_hi, v_weights, v_lo, v_hi, vertical_first):
    """The resize of an image given as its transpose ``xt`` (w, h) uint8 C-contiguous, with
    the ``plan`` arguments → (out_h, out_w) uint8 C-contiguous. A pass whose size does not
    change is skipped, as Pillow skips it."""
    w, h = xt.shape
    out_w, out_h = h_weights.shape[0], v_weights.shape[0]
    if vertical_first:
        x = _rows_pass(np.ascontiguousarray(xt.T), v_weights, v_lo, v_hi)
        if out_w == w:
            return x
        return np.ascontiguousarray(_rows_pass(np.ascontiguousarray(x.T), h_weights, h_lo, h_hi).T)
    xt_out = _rows_pass(xt, h_weights, h_lo, h_hi) if out_w != w else xt.copy()
    if out_h == h:
        return np.ascontiguousarray(xt_out.T)
    return _rows_pass(np.ascontiguousarray(xt_out.T), v_weights, v_lo, v_hi)


def lanczos_resize(grey: np.ndarray, out_w: int, out_h: int) -> np.ndarray:
    """(h, w) uint8 grey → (out_h, out_w) uint8 C-contiguous, equal to Pillow's
    ``Image.fromarray(grey).resize((out_w, out_h), Image.Resampling.LANCZOS)``.

    Each pass runs along axis 0 of its input, so the kernel takes the transpose; that costs
    nothing when ``grey`` is itself a transposed view of a C-contiguous array
    (``Planes.luma``), and one copy otherwise.
    """
    h, w = grey.shape
    xt = np.ascontiguousarray(np.asarray(grey, dtype=np.uint8).T).view()
    xt.flags.writeable = False
    return lanczos_t(xt, *plan(h, w, out_h, out_w))
