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
so JPEG noise and the degrade edit's blur count for little. ``LADDER_VIEW`` compares crop
ladder pairs (``krea2.curate.dedup``) on band-passed centre windows instead: see there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

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
NO_HUE_CHECK = 360.0  # a hue tolerance no gap exceeds


def thumbnail(
    pixels: np.ndarray,
    side: int = 96,
    original: tuple[int, int] | None = None,
    sigma: float = 0.6,
    low_cut: float = 0.0,
    centre: float = 1.0,
) -> tuple[np.ndarray, float]:
    """(h, w, 3) uint8 → (float32 thumbnail with longer side ``side``, blurred at ``sigma``
    px; the factor it was scaled by relative to the ``original`` (width, height) the pixels
    were decoded from, default their own size). ``low_cut`` > 0 subtracts a blur of that σ
    (px), keeping edges and dropping the low-frequency layout (a band-pass: no longer RGB);
    ``centre`` < 1 keeps only the centred window of that share of each side (the factor,
    a pixel scale, is unchanged)."""
    w, h = original or (pixels.shape[1], pixels.shape[0])
    f = side / max(h, w)
    small = cv2.resize(
        pixels, (max(8, round(w * f)), max(8, round(h * f))), interpolation=cv2.INTER_AREA
    ).astype(np.float32)
    out = cv2.GaussianBlur(small, (0, 0), sigma)
    if low_cut > 0:
        out -= cv2.GaussianBlur(small, (0, 0), low_cut)
    if centre < 1:  # filtered first, so the window's edges see their true neighbours
        y, x = round(out.shape[0] * (1 - centre) / 2), round(out.shape[1] * (1 - centre) / 2)
        out = np.ascontiguousarray(out[y : out.shape[0] - y, x : out.shape[1] - x])
    return out, f


@dataclass(frozen=True)
class View:
    """How two images are compared: ``thumbnail``'s settings and ``copy_score``'s hue
    tolerance (degrees). The default is the semantic pass's (with its ``verify_side``)."""

    side: int = 96
    sigma: float = 0.6
    low_cut: float = 0.0
    centre: float = 1.0
    hue: float = MAX_HUE_GAP

    def thumbnail(
        self, pixels: np.ndarray, original: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, float]:
        return thumbnail(pixels, self.side, original, self.sigma, self.low_cut, self.centre)

    @property
    def thumbnail_bytes(self) -> int:
        """The most bytes one thumbnail holds (a square image's)."""
        return int(np.ceil(self.side * self.centre)) ** 2 * 3 * 4


# Crop-ladder pairs (``dedup.ladder_pairs``; measured in docs/curate.md). The centre window
# keeping 70% of each side leaves out what the ladder's inner levels already leave out: a
# watermark box in a corner, a caption strip along an edge, which otherwise dominate the
# correlation of a dark or flat photo (a box on the Hubble deep field: 0.35 in the semantic
# pass's view). The band-pass (σ 1 to 4 px at 160 px) drops what flat synthetic scenes share
# by layout alone (a background gradient, a blob in one place: ShapesWorld's different shapes
# of one colour in one cell reach 0.96 unfiltered, 0.81 filtered) and keeps the edges a copy
# shares. Band-passed thumbnails carry no hue: ladder pairs passed the colorhash and
# hue-histogram vetoes before.
LADDER_VIEW = View(side=160, sigma=1.0, low_cut=4.0, centre=0.7, hue=NO_HUE_CHECK)

# Row index → (its decoded (h, w, 3) uint8 pixels, the (width, height) of the original they
# were decoded from or None for their own size), or None when the image no longer reads.
PixelReader = Callable[[int], tuple[np.ndarray, tuple[int, int] | None] | None]


def decoding_reader(
    fetch: Callable[[int], bytes], sizes: Sequence[tuple[int, int] | None]
) -> PixelReader:
    """A ``PixelReader`` that decodes (at the analysis size) the bytes ``fetch(i)`` returns;
    ``sizes[i]``: the original's (width, height). Bytes that no longer read or decode
    (``OSError``, ``DecodeError``) read as None."""
    from krea2.curate.decode import DecodeError, decode

    def read(i: int) -> tuple[np.ndarray, tuple[int, int] | None] | None:
        try:
            return decode(fetch(i)).pixels, sizes[i]
        except (OSError, DecodeError):
            return None

    return read


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


def _runs(local: np.ndarray, n: int, max_rows: int) -> list[list[int]]:
    """Indices of the (p, 2) ``local`` pairs (of rows 0..n-1) in runs that each name at most
    ``max_rows`` rows (one pair may name two), taken component by component of the pairs'
    graph, so that a component that fits is decoded once."""
    graph = coo_matrix((np.ones(len(local)), (local[:, 0], local[:, 1])), (n, n))
    component = connected_components(graph, directed=False)[1]
    out: list[list[int]] = []
    seen: set[int] = set()
    for k in np.argsort(component[local[:, 0]], kind="stable").tolist():
        new = {int(r) for r in local[k]} - seen
        if out and len(seen) + len(new) <= max_rows:
            out[-1].append(k)
            seen |= new
        else:
            out.append([k])
            seen = {int(r) for r in local[k]}
    return out


def verify_read(
    pairs: np.ndarray,
    read: PixelReader,
    threshold: float,
    view: View = View(),
    joined: np.ndarray | None = None,
    memory_bytes: int = 256 << 20,
) -> tuple[np.ndarray, np.ndarray]:
    """Which of the (p, 2) row ``pairs`` are copies on their pixels: (p,) bool
    ``copy_score ≥ threshold`` under ``view``, and (p,) float32 the scores (NaN: not checked).

    ``joined`` (rows,) component ids of rows already known to be one group, or None: a pair
    whose rows are joined (by it or by the pairs kept before it) changes no group, so it is
    neither checked nor returned. Only the images of checked pairs are read, each once while
    its component of the pairs' graph fits in ``memory_bytes`` of thumbnails (a larger one
    is split: its images at a cut are read again). A pair with an image that does not read
    is dropped (nothing to compare it with)."""
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    ok = np.zeros(len(pairs), bool)
    scores = np.full(len(pairs), np.nan, np.float32)
    if not len(pairs):
        return ok, scores
    rows, local = np.unique(pairs, return_inverse=True)
    local = local.reshape(-1, 2)
    parent = list(range(len(rows)))  # union-find over the pairs' rows
    if joined is not None:
        first: dict[int, int] = {}
        for k, g in enumerate(np.asarray(joined)[rows].tolist()):
            parent[k] = first.setdefault(g, k)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = x = parent[parent[x]]
        return x

    max_rows = max(2, memory_bytes // view.thumbnail_bytes)
    for run in _runs(local, len(rows), max_rows):
        thumbs: dict[int, tuple[np.ndarray, float] | None] = {}
        for k in run:
            a, b = (int(r) for r in local[k])
            if joined is not None and root(a) == root(b):
                continue
            for r in (a, b):
                if r not in thumbs:
                    got = read(int(rows[r]))
                    thumbs[r] = None if got is None else view.thumbnail(*got)
            ta, tb = thumbs[a], thumbs[b]
            if ta is None or tb is None:
                continue
            scores[k] = copy_score(ta, tb, view.hue)
            ok[k] = scores[k] >= threshold
            if ok[k]:
                parent[root(a)] = root(b)
    return ok, scores
