"""Read a ShapesWorld image back into objects: colour segmentation, components, shape, cell."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import cv2
import numpy as np
from PIL import Image, ImageDraw

from krea2.curate.shapes.render import draw_shape
from krea2.curate.shapes.spec import COLORS, SHAPES

TEMPLATE = 32  # px side of the shape templates a component is compared with
COLOR_DISTANCE = 70.0  # max RGB distance from a palette colour for a pixel to count as it
MIN_AREA_OF_CELL = 0.03  # components smaller than this share of a cell are noise
# Holes of at least this share of a component's silhouette are filled before its shape is
# read: an outline's (>= 0.056 at 32-128 px), not the specks colour noise makes in a
# filled shape (99% of them below 0.048), so filled reads stay as calibrated.
HOLE_MIN_SHARE = 0.05
RIM_DEPTH = 2.0  # px: a blend rim is at most twice this thick (see _is_blend_rim)
# A shape read is "unclear" when the best template IoU beats the runner-up by less than
# this: such an object meets no shape requirement (``verify``), instead of a coin flip.
# Calibrated by ``verifier_validation`` (rerun: ``benchmarks/shapes_verifier.py``): on the
# "model" degradation (blur, corner rounding, ragged edges, jitter and colour noise at once,
# each at a random strength up to medium), 2000 seeded scenes (seed 0) of all four shapes at
# 32, 64 and 128 px, it is the smallest margin on a 0.005 grid at which the reads it
# decides are >= 99% right (0.9905 there, where forced choice is 0.923 right). Seeds 1-5
# at 300 scenes each give 0.065-0.07.
UNCLEAR_MARGIN = 0.065


@dataclass(frozen=True)
class DetectedObject:
    """One connected component of one palette colour. ``area`` = its pixels, ``bbox`` =
    (x, y, w, h) px, ``centroid`` = (x, y) px, ``shape_scores`` = template IoU per shape (of
    the component with its holes filled, so an outline reads as its shape); ``hole_share`` =
    the share of that filled silhouette the component leaves out (~0 for a filled shape,
    0.06-0.6 for an outline, see ``style_measures.object_style_of``)."""

    color: str
    shape: str
    cell: int
    area: int
    bbox: tuple[int, int, int, int]
    centroid: tuple[float, float]
    shape_scores: dict[str, float]
    hole_share: float = 0.0

    @property
    def margin(self) -> float:
        """How far the read shape's template IoU beats the runner-up's."""
        top = sorted(self.shape_scores.values(), reverse=True)
        return top[0] - top[1] if len(top) > 1 else 1.0

    def clear_shape(self, margin: float = UNCLEAR_MARGIN) -> str | None:
        """``shape``, or ``None`` when it wins by less than ``margin`` (0: forced choice)."""
        return self.shape if margin <= 0 or self.margin >= margin else None


@cache
def _templates() -> dict[str, np.ndarray]:
    out = {}
    for shape in SHAPES:
        img = Image.new("L", (TEMPLATE * 8, TEMPLATE * 8), 0)
        draw_shape(ImageDraw.Draw(img), shape, (0, 0, TEMPLATE * 8, TEMPLATE * 8), 255)
        small = cv2.resize(np.asarray(img), (TEMPLATE, TEMPLATE), interpolation=cv2.INTER_AREA)
        out[shape] = small.astype(np.float32) / 255.0
    return out


def classify_shape(coverage: np.ndarray) -> dict[str, float]:
    """Soft IoU (Σmin / Σmax) of a (h, w) float coverage map in [0, 1], cropped to the shape's
    bounding box and stretched to the template size, with each shape's template."""
    m = cv2.resize(
        coverage.astype(np.float32), (TEMPLATE, TEMPLATE), interpolation=cv2.INTER_LINEAR
    )
    scores = {}
    for shape, t in _templates().items():
        union = np.maximum(m, t).sum()
        scores[shape] = float(np.minimum(m, t).sum() / union) if union else 0.0
    return scores


def _coverage(pixels: np.ndarray, inside: np.ndarray, color: np.ndarray) -> np.ndarray:
    """Per-pixel share of the object colour in a crop: anti-aliased edge pixels are a blend of
    the object and the local background, so project each onto the background→colour line.
    Small shapes (a 6-px circle at 32×32) are mostly edge, so this decides their class."""
    px = pixels.astype(np.float32)
    outside = ~inside
    bg = np.median(px[outside], axis=0) if outside.any() else np.zeros(3, np.float32)
    axis = color - bg
    alpha = ((px - bg) @ axis) / max(float(axis @ axis), 1.0)
    alpha = np.clip(alpha, 0.0, 1.0)
    alpha[inside] = 1.0
    return alpha


def color_labels(pixels: np.ndarray, max_distance: float = COLOR_DISTANCE) -> np.ndarray:
    """(h, w) int: index into ``COLORS`` of each pixel's nearest palette colour, −1 if none is
    within ``max_distance`` (ties: the first colour in ``COLORS``)."""
    px = np.asarray(pixels)
    if px.dtype != np.uint8:  # the table covers uint8 RGB; anything else is measured
        return _nearest_colors(px.reshape(-1, 3), max_distance).reshape(px.shape[:2])
    rgb = px.reshape(-1, 3).astype(np.int32)
    keys = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
    return _label_table(float(max_distance))[keys].astype(np.intp).reshape(px.shape[:2])


def _nearest_colors(rgb: np.ndarray, max_distance: float) -> np.ndarray:
    """(n,) int: ``color_labels`` of (n, 3) RGB values, by measuring every distance."""
    palette = np.asarray(list(COLORS.values()), np.int32)  # (k, 3)
    dist2 = ((rgb.astype(np.int32)[:, None] - palette[None]) ** 2).sum(axis=2)  # (n, k)
    nearest = dist2.argmin(axis=1)
    nearest[dist2.min(axis=1) > max_distance**2] = -1
    return nearest


@cache
def _label_table(max_distance: float) -> np.ndarray:
    """int8 [2^24]: ``color_labels`` of every uint8 RGB colour, indexed by r << 16 | g << 8
    | b. Scoring reads every pixel of thousands of samples (ShapesEval, the RL rewards, the
    style measures); a lookup is ~40x faster than measuring 8 distances per pixel. Filled
    colour by colour over the cube around each within ``max_distance``, a strict ``<``
    keeping the first of equally near colours as ``argmin`` does (~0.2 s once per process
    at the default distance)."""
    table = np.full((256, 256, 256), -1, np.int8)
    best = np.full((256, 256, 256), np.iinfo(np.int32).max, np.int32)
    reach = int(np.floor(abs(max_distance)))  # d^2 <= max_distance^2 within this box
    for k, color in enumerate(COLORS.values()):
        lo = [max(0, int(c) - reach) for c in color]
        hi = [min(255, int(c) + reach) + 1 for c in color]
        axes = [
            (np.arange(a, b, dtype=np.int32) - int(c)) ** 2
            for a, b, c in zip(lo, hi, color, strict=True)
        ]
        dist2 = axes[0][:, None, None] + axes[1][None, :, None] + axes[2][None, None, :]
        box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        nearer = (dist2 <= max_distance**2) & (dist2 < best[box])
        best[box][nearer] = dist2[nearer]
        table[box][nearer] = k
    return table.reshape(-1)


def fill_holes(mask: np.ndarray, min_share: float = 0.0) -> np.ndarray:
    """(h, w) bool mask with its holes filled: the False regions that no 4-connected path
    joins to the border (an outline's ring becomes its solid shape). Only holes of at least
    ``min_share`` of the filled silhouette are filled."""
    background = np.pad(~mask, 1, constant_values=True).astype(np.uint8)  # framed by 1s
    cv2.floodFill(background, None, (0, 0), 2)  # 4-connected: the complement of 8-connected
    holes = background[1:-1, 1:-1] == 1  # background the border never reached
    if min_share > 0 and holes.any():
        _, label, stats, _ = cv2.connectedComponentsWithStats(holes.astype(np.uint8), None, 4)
        big = stats[:, cv2.CC_STAT_AREA] >= min_share * (mask.sum() + holes.sum())
        big[0] = False  # label 0 is everything that is not a hole
        holes = big[label]
    return mask | holes


def cell_of(x: float, y: float, width: int, height: int) -> int:
    col = min(2, max(0, int(3 * x / width)))
    row = min(2, max(0, int(3 * y / height)))
    return 3 * row + col


def _is_blend_rim(component: np.ndarray, colour: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether a component (bool crop with a 1-px margin) is the rim where a larger object of
    another colour blends into the background (orange on maroon passes through red): it is
    at most ``2 × RIM_DEPTH`` px thick and touches a larger component of another colour
    (``colour``: palette index per pixel of the crop, −1 none; ``sizes``: that component's
    area per pixel). Objects never touch in a render, so a genuine one is never dropped."""
    near = cv2.dilate(component.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    own = int(component.sum())
    if not np.any(near & (colour >= 0) & ~component & (sizes > own)):
        return False
    depth = cv2.distanceTransform(np.pad(component.astype(np.uint8), 1), cv2.DIST_L2, 3)
    return float(depth.max()) <= RIM_DEPTH


def detect_objects(
    pixels: np.ndarray, max_distance: float = COLOR_DISTANCE
) -> list[DetectedObject]:
    """Objects in (h, w, 3) uint8 RGB ``pixels``, largest first. A thin component that
    touches a larger one of another colour is a blend rim, not an object (``_is_blend_rim``)."""
    h, w = pixels.shape[:2]
    labels = color_labels(pixels, max_distance)
    min_area = max(3, int(MIN_AREA_OF_CELL * (min(h, w) / 3) ** 2))
    names = list(COLORS)
    palette = np.asarray(list(COLORS.values()), np.float32)
    sizes = np.zeros((h, w), np.int64)  # the area of each pixel's component
    components = []
    for k in np.unique(labels):
        if k < 0:
            continue
        mask = (labels == k).astype(np.uint8)
        n, comp, stats, cents = cv2.connectedComponentsWithStats(mask, connectivity=8)
        sizes[comp > 0] = stats[comp[comp > 0], cv2.CC_STAT_AREA]
        components += [(int(k), i, comp, stats[i], cents[i]) for i in range(1, n)]
    found: list[DetectedObject] = []
    for k, i, comp, stat, cent in components:
        x, y, bw, bh, area = (int(v) for v in stat)
        if area < min_area:
            continue
        # A 1-px margin catches the anti-aliased rim the colour threshold left out.
        x0, y0, x1, y1 = max(0, x - 1), max(0, y - 1), min(w, x + bw + 1), min(h, y + bh + 1)
        component = comp[y0:y1, x0:x1] == i
        if _is_blend_rim(component, labels[y0:y1, x0:x1], sizes[y0:y1, x0:x1]):
            continue
        inside = fill_holes(component, HOLE_MIN_SHARE)  # an outline reads as its shape
        cover = _coverage(pixels[y0:y1, x0:x1], inside, palette[k])
        cover[(comp[y0:y1, x0:x1] > 0) & ~inside] = 0.0  # another component of this colour
        rows, cols = np.nonzero(cover >= 0.25)
        cover = cover[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        scores = classify_shape(cover)
        # The bounding-box centre, not the centroid, decides the cell: a triangle's
        # centroid sits low in its box.
        cell = cell_of(x + bw / 2, y + bh / 2, w, h)
        found.append(
            DetectedObject(
                names[k],
                max(scores, key=scores.__getitem__),
                cell,
                area,
                (x, y, bw, bh),
                (float(cent[0]), float(cent[1])),
                scores,
                1.0 - float(component.sum()) / float(inside.sum()),
            )
        )
    return sorted(found, key=lambda o: -o.area)
