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
    """One connected component of one palette colour. ``bbox`` = (x, y, w, h) px,
    ``centroid`` = (x, y) px, ``shape_scores`` = template IoU per shape."""

    color: str
    shape: str
    cell: int
    area: int
    bbox: tuple[int, int, int, int]
    centroid: tuple[float, float]
    shape_scores: dict[str, float]

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
    within ``max_distance``."""
    palette = np.asarray(list(COLORS.values()), np.int32)  # (k, 3)
    px = pixels.reshape(-1, 1, 3).astype(np.int32)
    dist2 = ((px - palette[None]) ** 2).sum(axis=2)  # (n, k) squared distances
    nearest = dist2.argmin(axis=1)
    nearest[dist2.min(axis=1) > max_distance**2] = -1
    return nearest.reshape(pixels.shape[:2])


def cell_of(x: float, y: float, width: int, height: int) -> int:
    col = min(2, max(0, int(3 * x / width)))
    row = min(2, max(0, int(3 * y / height)))
    return 3 * row + col


def detect_objects(
    pixels: np.ndarray, max_distance: float = COLOR_DISTANCE
) -> list[DetectedObject]:
    """Objects in (h, w, 3) uint8 RGB ``pixels``, largest first."""
    h, w = pixels.shape[:2]
    labels = color_labels(pixels, max_distance)
    min_area = max(3, int(MIN_AREA_OF_CELL * (min(h, w) / 3) ** 2))
    names = list(COLORS)
    palette = np.asarray(list(COLORS.values()), np.float32)
    found: list[DetectedObject] = []
    for k in np.unique(labels):
        if k < 0:
            continue
        mask = (labels == k).astype(np.uint8)
        n, comp, stats, cents = cv2.connectedComponentsWithStats(mask, connectivity=8)
        for i in range(1, n):
            x, y, bw, bh, area = (int(v) for v in stats[i])
            if area < min_area:
                continue
            # A 1-px margin catches the anti-aliased rim the colour threshold left out.
            x0, y0, x1, y1 = max(0, x - 1), max(0, y - 1), min(w, x + bw + 1), min(h, y + bh + 1)
            inside = comp[y0:y1, x0:x1] == i
            cover = _coverage(pixels[y0:y1, x0:x1], inside, palette[k])
            cover[(comp[y0:y1, x0:x1] > 0) & ~inside] = 0.0  # another component of this colour
            rows, cols = np.nonzero(cover >= 0.25)
            cover = cover[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
            scores = classify_shape(cover)
            cx, cy = float(cents[i][0]), float(cents[i][1])
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
                    (cx, cy),
                    scores,
                )
            )
    return sorted(found, key=lambda o: -o.area)
