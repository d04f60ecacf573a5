"""Style measures on pixels: the background's kind and colours, object style, style similarity.

Everything is read from the non-object pixels only (the detector's colour masks, dilated),
so the same measure works on a render, a reference image and a model's sample. The
background is fitted with a plane per RGB channel (a linear ramp over the image): a solid
leaves a small slope and residual, a gradient a large slope and a small residual, a
texture a residual that is smooth (it survives a local average that removes pixel noise).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import cv2
import numpy as np

from krea2.curate.shapes.detect import color_labels, detect_objects
from krea2.curate.shapes.render import TEXTURE_AMPLITUDE
from krea2.curate.shapes.spec import BACKGROUND_COLORS

# Grey levels of the plane's change across the image (RGB norm) above which a background
# is a gradient; the closest pair of background colours differs by 38.5.
GRADIENT_RAMP = 20.0
# Grey levels (RMS of the locally averaged residual, channel mean) above which a background
# is a texture; textures are drawn at ±14 (render.TEXTURE_AMPLITUDE).
TEXTURE_RESIDUAL = 2.5
# Hole share (DetectedObject.hole_share) from which an object is read as outlined.
OUTLINE_HOLE_SHARE = 0.04
# Backgrounds are dark (no channel above 96, ±14 of texture): a pixel with a channel above
# this is an object, a word (white) or a rim blending one of them into the background.
BRIGHT = max(max(c) for c in BACKGROUND_COLORS.values()) + 3 * TEXTURE_AMPLITUDE
OUTLIER_FACTOR, OUTLIER_MIN = 4.0, 20.0  # trimmed refit (read_background), grey levels
SIMILARITY_SCALE = 40.0  # grey levels: a colour distance of 40 halves the colour term


def check_image(pixels: np.ndarray, name: str = "pixels") -> None:
    """ValueError unless ``pixels`` is an (h, w, 3) uint8 RGB array of at least 8×8."""
    if not isinstance(pixels, np.ndarray):
        raise ValueError(f"{name} must be a numpy array (h, w, 3) uint8, got {type(pixels)}")
    if pixels.dtype != np.uint8:
        raise ValueError(f"{name} must be uint8 RGB (0..255), got dtype {pixels.dtype}")
    if pixels.ndim != 3 or pixels.shape[2] != 3 or min(pixels.shape[:2]) < 8:
        raise ValueError(f"{name} must have shape (h, w, 3) with h, w >= 8, got {pixels.shape}")


def background_pixels(pixels: np.ndarray, dilate: int | None = None) -> np.ndarray:
    """(h, w) bool: True where (h, w, 3) uint8 ``pixels`` show background. Object pixels
    (the detector's colour masks, ``detect.color_labels``, and any pixel with a channel
    above ``BRIGHT``, as words and most rims have) are dilated by ``dilate`` px (default:
    2, or min(h, w) / 32 when larger) so anti-aliased and blurred rims are left out too;
    an outline's inside counts as background."""
    check_image(pixels)
    h, w = pixels.shape[:2]
    objects = (color_labels(pixels) >= 0) | (pixels.max(axis=2) > BRIGHT)
    r = max(2, round(min(h, w) / 32)) if dilate is None else dilate
    if r > 0:
        disc = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1))
        objects = cv2.dilate(objects.astype(np.uint8), disc) > 0
    return ~objects


@dataclass(frozen=True)
class BackgroundReading:
    """What the background pixels say (after the trimmed refit). ``kind``: solid, gradient
    or texture; ``mean``: mean RGB of the background pixels; ``direction``: the axis of the
    steeper ramp (vertical: top → bottom); ``start``/``end``: the fitted plane's RGB at the
    two ends of that axis (top/bottom or left/right, at the middle of the other axis);
    ``ramp``: the RGB norm of the plane's change along it, grey levels; ``texture``: RMS of
    the locally averaged residual, grey levels; ``share``: the share of the image's pixels
    the fit used."""

    kind: str
    mean: tuple[float, float, float]
    direction: str
    start: tuple[float, float, float]
    end: tuple[float, float, float]
    ramp: float
    texture: float
    share: float


def _rgb(v: np.ndarray) -> tuple[float, float, float]:
    return (float(v[0]), float(v[1]), float(v[2]))


def read_background(pixels: np.ndarray) -> BackgroundReading:
    """Read the background of (h, w, 3) uint8 ``pixels`` (see ``BackgroundReading``).
    With fewer than 16 background pixels there is nothing to fit: a solid of their mean
    (black when there are none)."""
    mask = background_pixels(pixels)
    h, w = mask.shape
    px = pixels.astype(np.float32)
    ys, xs = np.nonzero(mask)
    if len(ys) < 16:
        mean = px[mask].mean(axis=0) if len(ys) else np.zeros(3, np.float32)
        flat = _rgb(mean)
        return BackgroundReading(
            "solid", flat, "vertical", flat, flat, 0.0, 0.0, len(ys) / mask.size
        )
    # Plane per channel over centred coordinates in [-0.5, 0.5]: value = a + bx·x + by·y.
    design = np.stack([np.ones(len(ys)), (xs + 0.5) / w - 0.5, (ys + 0.5) / h - 0.5], axis=1)
    values = px[ys, xs]  # (n, 3)
    coef, *_ = np.linalg.lstsq(design, values, rcond=None)  # (3 terms, 3 channels)
    # Refit without the outliers (rims of blurred objects the mask missed): pixels whose
    # RGB residual is past OUTLIER_FACTOR × the median one, and past OUTLIER_MIN.
    far = np.linalg.norm(values - design @ coef, axis=1)
    keep = far <= max(OUTLIER_MIN, OUTLIER_FACTOR * float(np.median(far)))
    if keep.sum() >= 16 and not keep.all():
        ys, xs, design, values = ys[keep], xs[keep], design[keep], values[keep]
        mask = np.zeros_like(mask)
        mask[ys, xs] = True
        coef, *_ = np.linalg.lstsq(design, values, rcond=None)
    a, bx, by = coef
    vertical = float(np.linalg.norm(by)) >= float(np.linalg.norm(bx))
    slope = by if vertical else bx
    residual = np.zeros((h, w), np.float32)
    residual[ys, xs] = (values - design @ coef).mean(axis=1)
    k = max(3, round(min(h, w) / 32) | 1)  # odd box side: averages pixel noise away
    weight = cv2.boxFilter(mask.astype(np.float32), -1, (k, k), normalize=True)
    local = cv2.boxFilter(residual, -1, (k, k), normalize=True) / np.maximum(weight, 1e-6)
    texture = float(np.sqrt(np.mean(local[mask] ** 2)))
    ramp = float(np.linalg.norm(slope))
    if texture > TEXTURE_RESIDUAL:
        kind = "texture"
    elif ramp > GRADIENT_RAMP:
        kind = "gradient"
    else:
        kind = "solid"
    return BackgroundReading(
        kind,
        _rgb(values.mean(axis=0)),
        "vertical" if vertical else "horizontal",
        _rgb(a - slope / 2),
        _rgb(a + slope / 2),
        ramp,
        texture,
        float(mask.mean()),
    )


def classify_background(pixels: np.ndarray) -> str:
    """``solid``, ``gradient`` or ``texture``: the background kind of (h, w, 3) uint8
    ``pixels``, from the non-object pixels alone (``read_background``)."""
    return read_background(pixels).kind


def object_style_of(pixels: np.ndarray) -> list[str]:
    """``filled`` or ``outlined`` for each object ``detect_objects`` finds in (h, w, 3)
    uint8 ``pixels`` (same order): outlined when its hole share is at least
    ``OUTLINE_HOLE_SHARE``. At 32 px a small outline's hole may close up (read filled)."""
    check_image(pixels)
    return [
        "outlined" if o.hole_share >= OUTLINE_HOLE_SHARE else "filled"
        for o in detect_objects(pixels)
    ]


def _majority(styles: list[str]) -> str | None:
    return Counter(styles).most_common(1)[0][0] if styles else None


def _colour(distance: float) -> float:
    """The colour term of a style score: exp(−distance / SIMILARITY_SCALE), in (0, 1]."""
    return float(np.exp(-distance / SIMILARITY_SCALE))


@dataclass(frozen=True)
class StyleScore:
    """How far an image's style is from a reference's. ``kind_match``: the same background kind
    (and for two gradients the same direction); ``distance``: RGB distance in grey levels of
    the background means, or for two matching gradients the mean distance of their two ends;
    ``colour`` = exp(−distance / 40), in (0, 1]; ``similarity`` = 0.5·kind_match +
    0.5·colour, in [0, 1]. ``object_style``/``ref_object_style``: the majority object style
    of each (``None``: no object found); ``object_style_match``: whether they agree
    (``None`` if either is ``None``), reported beside ``similarity``, not in it."""

    kind: str
    ref_kind: str
    kind_match: bool
    distance: float
    similarity: float
    object_style: str | None
    ref_object_style: str | None

    @property
    def colour(self) -> float:
        """The colour half of ``similarity``: exp(−distance / 40)."""
        return _colour(self.distance)

    @property
    def object_style_match(self) -> bool | None:
        if self.object_style is None or self.ref_object_style is None:
            return None
        return self.object_style == self.ref_object_style


@dataclass(frozen=True)
class StyleReading:
    """What ``style_similarity`` reads of one image: its background and the majority
    object style (``None``: no object). Read a reference once (``read_style``) and compare
    many samples with it."""

    background: BackgroundReading
    object_style: str | None


def read_style(pixels: np.ndarray, name: str = "pixels") -> StyleReading:
    """The ``StyleReading`` of (h, w, 3) uint8 ``pixels`` (``name``: in the error)."""
    check_image(pixels, name)
    return StyleReading(read_background(pixels), _majority(object_style_of(pixels)))


def style_similarity(pixels: np.ndarray, ref_pixels: np.ndarray | StyleReading) -> StyleScore:
    """The ``StyleScore`` of (h, w, 3) uint8 ``pixels`` against the reference (h', w', 3)
    uint8 ``ref_pixels`` (any sizes: every colour is a mean or a plane end), or against its
    ``read_style`` reading."""
    own = read_style(pixels)
    ref = (
        ref_pixels if isinstance(ref_pixels, StyleReading) else read_style(ref_pixels, "ref_pixels")
    )
    out, ref_bg = own.background, ref.background
    match = out.kind == ref_bg.kind and (
        out.kind != "gradient" or out.direction == ref_bg.direction
    )
    if match and out.kind == "gradient":
        ends = [(out.start, ref_bg.start), (out.end, ref_bg.end)]
        distance = float(np.mean([np.linalg.norm(np.subtract(p, q)) for p, q in ends]))
    else:
        distance = float(np.linalg.norm(np.subtract(out.mean, ref_bg.mean)))
    similarity = 0.5 * float(match) + 0.5 * _colour(distance)
    return StyleScore(
        out.kind,
        ref_bg.kind,
        match,
        distance,
        similarity,
        own.object_style,
        ref.object_style,
    )
