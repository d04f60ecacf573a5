"""Render a ShapesWorld scene to RGB pixels at any size and aspect ratio."""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from krea2.curate.shapes.spec import (
    BACKGROUND_COLORS,
    COLORS,
    SIZES,
    TEXT_COLOR,
    Background,
    Scene,
    ShapeObject,
)

TEXTURE_AMPLITUDE = 14.0  # grey levels: visible, but far below any object colour distance
OUTLINE_STROKE = 0.22  # an outlined shape's stroke, as a share of its side (survives 64 px)


def _background(bg: Background, width: int, height: int) -> np.ndarray:
    base = np.asarray(BACKGROUND_COLORS[bg.color], np.float32)
    if bg.kind == "gradient":
        assert bg.color2 is not None
        end = np.asarray(BACKGROUND_COLORS[bg.color2], np.float32)
        n = height if bg.direction == "vertical" else width
        t = np.linspace(0.0, 1.0, n, dtype=np.float32)[:, None]
        ramp = base * (1 - t) + end * t  # (n, 3)
        img = (
            np.broadcast_to(ramp[:, None, :], (height, width, 3))
            if bg.direction == "vertical"
            else np.broadcast_to(ramp[None, :, :], (height, width, 3))
        )
    elif bg.kind == "texture":
        grid = (bg.frequency, bg.frequency)
        coarse = np.random.default_rng(bg.seed).uniform(-1, 1, grid).astype(np.float32)
        smooth = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
        img = base + TEXTURE_AMPLITUDE * smooth[:, :, None]
    else:
        img = np.broadcast_to(base, (height, width, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def object_box(obj: ShapeObject, width: float, height: float) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of the object's square bounding box, in pixels."""
    cw, ch = width / 3, height / 3
    row, col = divmod(obj.cell, 3)
    side = SIZES[obj.size] * min(cw, ch)
    # Jitter moves the centre by up to 80% of the free margin, so shapes never leave their cell.
    cx = (col + 0.5) * cw + obj.jitter[0] * 0.8 * (cw - side) / 2
    cy = (row + 0.5) * ch + obj.jitter[1] * 0.8 * (ch - side) / 2
    return cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2


def shape_polygon(shape: str, box: tuple[float, float, float, float]) -> list[tuple[float, float]]:
    """Vertices of a polygonal shape inside ``box`` (triangle points up, diamond is a rhombus)."""
    x0, y0, x1, y1 = box
    xm, ym = (x0 + x1) / 2, (y0 + y1) / 2
    if shape == "square":
        return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    if shape == "triangle":
        return [(xm, y0), (x1, y1), (x0, y1)]
    if shape == "diamond":
        return [(xm, y0), (x1, ym), (xm, y1), (x0, ym)]
    raise ValueError(f"{shape!r} is not a polygon")


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[float, ...], fill: tuple) -> None:
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon(shape_polygon(shape, box), fill=fill)  # type: ignore[arg-type]


def draw_outlined(
    canvas: Image.Image, shape: str, box: tuple[float, float, float, float], fill: tuple
) -> None:
    """Draw ``shape`` in ``box`` as an outline on ``canvas`` (in place): the filled shape
    less its inset by ``OUTLINE_STROKE`` × the box side, so the outer silhouette is the
    filled shape's and the inside keeps the background."""
    x0, y0 = max(0, int(np.floor(box[0])) - 1), max(0, int(np.floor(box[1])) - 1)
    x1 = min(canvas.width, int(np.ceil(box[2])) + 2)
    y1 = min(canvas.height, int(np.ceil(box[3])) + 2)
    if x1 <= x0 or y1 <= y0:
        return
    mask = Image.new("L", (x1 - x0, y1 - y0), 0)
    local = (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0)
    draw_shape(ImageDraw.Draw(mask), shape, local, 255)
    filled = np.asarray(mask) > 127
    # Distance to the outside (beyond the crop counts as outside): the inset is where it
    # exceeds the stroke, so corners stay sharp and every side gets the same stroke.
    padded = np.pad(filled.astype(np.uint8), 1)
    depth = cv2.distanceTransform(padded, cv2.DIST_L2, 5)[1:-1, 1:-1]
    ring = filled & (depth <= OUTLINE_STROKE * (box[2] - box[0]))
    canvas.paste(fill, (x0, y0), Image.fromarray(ring.astype(np.uint8) * 255))


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=max(1, size))


def render(scene: Scene, width: int, height: int, supersample: int | None = None) -> np.ndarray:
    """Render ``scene`` → (height, width, 3) uint8 RGB.

    Shapes are drawn at ``supersample``× (default: 4 below 128 px, else 2) and area-averaged
    down, so edges are anti-aliased even at 32×32; ``scene.object_style == "outlined"``
    draws each as a ring of ``OUTLINE_STROKE`` × its side (``draw_outlined``).
    """
    if width < 8 or height < 8:
        raise ValueError(f"render size {width}x{height} is too small (minimum 8x8)")
    ss = supersample or (4 if min(width, height) < 128 else 2)
    W, H = width * ss, height * ss
    canvas = Image.fromarray(_background(scene.background, W, H))
    draw = ImageDraw.Draw(canvas)
    for obj in scene.objects:
        if scene.object_style == "outlined":
            draw_outlined(canvas, obj.shape, object_box(obj, W, H), COLORS[obj.color])
        else:
            draw_shape(draw, obj.shape, object_box(obj, W, H), COLORS[obj.color])
    if scene.word is not None:
        row, col = divmod(scene.word.cell, 3)
        cw, ch = W / 3, H / 3
        font = _font(int(min(ch * 0.32, cw * 1.6 / max(3, len(scene.word.text)))))
        centre = ((col + 0.5) * cw, (row + 0.5) * ch)
        draw.text(centre, scene.word.text, fill=TEXT_COLOR, font=font, anchor="mm")
    pixels = np.asarray(canvas)
    if ss > 1:
        pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(pixels)
