"""Pixel verification of embedding candidates: is one image a crop or tone edit of the other?

An embedding puts copies near their source, but also near scenes that merely look alike
(the same shape in the same place), and how far apart those end up depends on how well the
encoder was trained. Copy-detection systems therefore verify candidate pairs on the pixels
before calling them copies (SSCD's authors and the DISC21 entries re-rank with local
matching). Here the check is direct: the smaller-content image of a pair is searched inside
the other over a range of scales with normalised cross-correlation (OpenCV's
``TM_CCOEFF_NORMED``, per channel means removed, all channels together). A crop sits at
some offset and scale inside its source; a tone curve (the same on every channel) or a
blur leaves the correlation high; a different shape, colour or layout does not.

Thumbnails keep the aspect ratio (the longer side ``side`` px) and are blurred a little,
so JPEG noise and the degrade edit's blur count for little.
"""

from __future__ import annotations

import cv2
import numpy as np

# Two hypotheses of how the copy was scaled: at the source's own pixel scale (a crop, as
# cut), or resized to fill the source's frame (a crop blown back up); each with a little
# slack. A free search over scales would let a scaled square pass for a circle.
SLACK: tuple[float, ...] = (0.97, 1.0, 1.03)
# A copy's window keeps at least this share of each side of its source (the policy's crops
# keep 78%, with a margin), so a scene is not a "copy" of one corner of a bigger one.
MIN_KEPT = 0.72
# Normalised correlation cannot tell yellow from orange (the red channel is the same, the
# green one only scaled), so the aligned windows' hues must also agree within this many
# degrees: the demo pool's strongest tone curves move them by up to 12, the palette's
# neighbours (yellow, orange) are ~20 apart.
MAX_HUE_GAP = 14.0


def thumbnail(
    pixels: np.ndarray, side: int = 96, original: tuple[int, int] | None = None
) -> tuple[np.ndarray, float]:
    """(h, w, 3) uint8 → (float32 thumbnail with longer side ``side``, lightly blurred;
    the factor it was scaled by relative to the ``original`` (width, height) the pixels
    were decoded from, default their own size)."""
    w, h = original or (pixels.shape[1], pixels.shape[0])
    f = side / max(h, w)
    small = cv2.resize(
        pixels, (max(8, round(w * f)), max(8, round(h * f))), interpolation=cv2.INTER_AREA
    )
    return cv2.GaussianBlur(small.astype(np.float32), (0, 0), 0.6), f


def _hue_gap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean circular hue difference in degrees between two aligned float32 RGB patches, over
    the pixels saturated in both (0 when fewer than 1% are: their hue says nothing). A tone
    curve moves a hue by a few degrees; a recolouring (orange for yellow) by 20 or more."""
    ha, hb = (cv2.cvtColor(np.clip(x, 0, 255).astype(np.uint8), cv2.COLOR_RGB2HSV) for x in (a, b))
    mask = (ha[..., 1] > 64) & (ha[..., 2] > 51) & (hb[..., 1] > 64) & (hb[..., 2] > 51)
    if mask.mean() < 0.01:
        return 0.0
    d = np.abs(ha[..., 0][mask].astype(np.int32) - hb[..., 0][mask].astype(np.int32))
    return float(np.minimum(d, 180 - d).mean() * 2.0)  # OpenCV's hue is in 2° steps


def _best(big: tuple[np.ndarray, float], small: tuple[np.ndarray, float], hue: float) -> float:
    """Best correlation of ``small`` (at its native or its fitted scale, with ``SLACK``)
    over windows of ``big`` that keep at least ``MIN_KEPT`` of each of its sides and whose
    colours agree within ``hue`` degrees (−1 when none does)."""
    (b, fb), (t0, ft) = big, small
    bh, bw = b.shape[:2]
    sh, sw = t0.shape[:2]
    best = -1.0
    for base in {fb / ft, min(bh / sh, bw / sw)}:
        for s in SLACK:
            w, h = round(sw * base * s), round(sh * base * s)
            if w < MIN_KEPT * bw or h < MIN_KEPT * bh or w > bw or h > bh:
                continue  # not a crop the copy policy makes (or bigger than the source)
            t = cv2.resize(t0, (w, h), interpolation=cv2.INTER_AREA)
            if float(t.std()) < 1e-3:  # a flat template correlates with nothing
                continue
            score = np.nan_to_num(cv2.matchTemplate(b, t, cv2.TM_CCOEFF_NORMED), nan=-1.0)
            y, x = np.unravel_index(int(score.argmax()), score.shape)
            if score[y, x] > best and _hue_gap(b[y : y + h, x : x + w], t) <= hue:
                best = float(score[y, x])
    return best


def copy_score(
    a: tuple[np.ndarray, float], b: tuple[np.ndarray, float], hue: float = MAX_HUE_GAP
) -> float:
    """How well thumbnail ``b`` matches a window of ``a`` or ``a`` one of ``b`` (the best
    normalised correlation, −1..1; 1 = a pixel-exact crop), among alignments whose colours
    agree within ``hue`` degrees. Both ways: which of the two is the crop is not known.
    ``a``, ``b``: ``thumbnail`` results."""
    return max(_best(a, b, hue), _best(b, a, hue))


def top_candidates(pairs: np.ndarray, sims: np.ndarray, per_row: int) -> np.ndarray:
    """Indices of the (p, 2) ``pairs`` that are among the ``per_row`` most similar of at
    least one of their rows (by ``sims``), so the pixel check costs O(rows · per_row)."""
    order = np.argsort(-sims, kind="stable")
    seen: dict[int, int] = {}
    keep = []
    for k in order.tolist():
        i, j = int(pairs[k, 0]), int(pairs[k, 1])
        if seen.get(i, 0) < per_row or seen.get(j, 0) < per_row:
            keep.append(k)
        seen[i] = seen.get(i, 0) + 1
        seen[j] = seen.get(j, 0) + 1
    return np.sort(np.asarray(keep, np.int64))


def verify_pairs(
    thumbs: dict[int, tuple[np.ndarray, float]], pairs: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Which of the (p, 2) candidate ``pairs`` (row indices into ``thumbs``) are copies:
    (p,) bool ``copy_score ≥ threshold``, and (p,) float32 the scores."""
    scores = np.asarray(
        [copy_score(thumbs[int(i)], thumbs[int(j)]) for i, j in pairs], np.float32
    ).reshape(len(pairs))
    return scores >= threshold, scores
