"""Validate the verifier's shape reads on degraded renders whose labels are known.

A trained toy model draws soft blobs, not the renderer's crisp polygons, so the verifier is
checked on renders degraded the way samples look, each kind at a mild, a medium and (for
the first three) a stress strength:

- ``blur``: each shape's edge blurred, Gaussian sigma = strength × the shape's side;
- ``round``: corners rounded by a morphological opening with a disc of radius strength ×
  the shape's inradius (1.0 would leave only the inscribed disc: a square becomes a circle);
- ``ragged``: the boundary moved in and out by smooth noise (about four bumps along a
  side) of amplitude strength × side;
- ``jitter``: each shape anywhere in its cell (strength × the free margin, per axis);
- ``color``: each shape's colour shifted (sigma = strength per RGB channel), plus
  per-pixel noise of half that;
- ``model``: all of them at once, each at a random strength up to its medium one: the
  kind that looks most like samples, on which ``detect.UNCLEAR_MARGIN`` is calibrated.

With ``backgrounds="styled"`` every scene is drawn on a background of the style stage's
(:func:`krea2.curate.shapes.sample_style`: solid, gradient or texture in any background
colour) instead of its own, the objects unchanged: the verifier must read a sample on those
as well as on the world's, or a style module's content score would measure the background.

Every read records the template-IoU margin of the best shape over the runner-up, so one
validation run scores any unclear margin (:func:`summarize`, :func:`confusion`) and
calibrates it (:func:`calibrate_margin`). Everything is seeded; 300 scenes of every kind
at 32, 64 and 128 px take about a minute of CPU (``benchmarks/shapes_verifier.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import cv2
import numpy as np
from PIL import Image, ImageDraw

from krea2.curate.shapes.detect import UNCLEAR_MARGIN, detect_objects
from krea2.curate.shapes.render import draw_shape, object_box, render
from krea2.curate.shapes.sample import sample_scene
from krea2.curate.shapes.spec import COLORS, SHAPES, SIZES, Scene, ShapeObject
from krea2.curate.shapes.styles import sample_style

# Strengths per kind (see the module docstring for the units); "model" draws its own.
DEGRADATIONS: dict[str, tuple[float, ...]] = {
    "clean": (0.0,),
    "blur": (0.05, 0.1, 0.15),
    "round": (0.2, 0.4, 0.6),
    "ragged": (0.03, 0.06, 0.09),
    "jitter": (0.5, 1.0),
    "color": (15.0, 30.0),
    "model": (1.0,),
}
RESOLUTIONS: tuple[int, ...] = (32, 64, 128)
BACKGROUNDS: tuple[str, ...] = ("world", "styled")  # see the module docstring
TARGET_ACCURACY = 0.99  # the accuracy the calibrated margin must give the shapes it decides
MARGIN_STEP = 0.005  # the grid of candidate margins
# detect.UNCLEAR_MARGIN = calibrate_margin(calibration_reads()): the "model" degradation,
# the one that looks like samples, on this many scenes of this seed.
CALIBRATION_SCENES = 2000
CALIBRATION_SEED = 0
_SUPERSAMPLE = 4
# Radius of the largest disc inside each shape, as a share of its side: rounding 1.0 would
# leave that disc (a circle's own rounding changes nothing).
_INRADIUS = {"circle": 0.5, "square": 0.5, "triangle": 2 / (1 + 5**0.5) / 2, "diamond": 0.5**1.5}


@dataclass(frozen=True)
class ShapeRead:
    """One object of one degraded render: its true and read shape (``None``: no component
    found at its place), the template-IoU margin of the read over the runner-up, and
    whether the colour and cell were read right."""

    resolution: int
    kind: str
    strength: float
    true_shape: str
    read_shape: str | None
    runner_up: str | None
    margin: float
    color_ok: bool
    cell_ok: bool

    @property
    def stress(self) -> bool:
        """The strongest of three strengths: past where a sample still shows its shape
        (a diamond blurred into a disc), reported but left out of the calibration."""
        levels = DEGRADATIONS[self.kind]
        return len(levels) == 3 and self.strength == levels[-1]


def _dist(mask: np.ndarray) -> np.ndarray:
    """Distance of each True pixel to the nearest False one (0 on False pixels); beyond
    the array counts as True, so its edge is not an outline."""
    padded = np.pad(mask.astype(np.uint8), 1, constant_values=1)
    return cv2.distanceTransform(padded, cv2.DIST_L2, 5)[1:-1, 1:-1]


def _alpha(
    obj: ShapeObject, size: int, rng: np.random.Generator, levels: dict[str, float]
) -> np.ndarray:
    """The object's (size, size) coverage: drawn at 4× in a window around it, rounded and
    made ragged there, area-averaged down, then blurred."""
    ss = _SUPERSAMPLE
    x0, y0, x1, y1 = object_box(obj, size, size)
    side = x1 - x0
    pad = 0.3 * side + 2  # room for the ragged edge to grow out, in output pixels
    wx0, wy0 = max(0, int(x0 - pad)), max(0, int(y0 - pad))
    wx1, wy1 = min(size, int(np.ceil(x1 + pad))), min(size, int(np.ceil(y1 + pad)))
    img = Image.new("L", ((wx1 - wx0) * ss, (wy1 - wy0) * ss), 0)
    box = ((x0 - wx0) * ss, (y0 - wy0) * ss, (x1 - wx0) * ss, (y1 - wy0) * ss)
    draw_shape(ImageDraw.Draw(img), obj.shape, box, 255)
    mask = np.asarray(img) > 127
    if levels["round"] > 0:  # opening: erosion, then dilation, by a disc of radius r
        r = levels["round"] * side * ss * _INRADIUS[obj.shape]
        mask = _dist(~(_dist(mask) > r)) <= r
    if levels["ragged"] > 0:  # move the boundary by smooth noise, ~4 bumps along a side
        signed = _dist(mask) - _dist(~mask)  # > 0 inside, < 0 outside
        n = max(2, round(4 * max(mask.shape) / (side * ss)))
        coarse = rng.uniform(-1, 1, (n + 1, n + 1)).astype(np.float32)
        noise = cv2.resize(coarse, mask.shape[::-1], interpolation=cv2.INTER_CUBIC)
        mask = signed + levels["ragged"] * side * ss * np.clip(noise, -1, 1) > 0
    out = np.zeros((size, size), np.float32)
    small = cv2.resize(
        mask.astype(np.float32), (wx1 - wx0, wy1 - wy0), interpolation=cv2.INTER_AREA
    )
    out[wy0:wy1, wx0:wx1] = small
    if levels["blur"] > 0:
        out = cv2.GaussianBlur(out, (0, 0), levels["blur"] * side)
    return out


def degraded_render(
    scene: Scene, size: int, kind: str, strength: float, rng: np.random.Generator
) -> tuple[Scene, np.ndarray]:
    """(the scene as drawn, its (size, size, 3) uint8 render degraded by ``kind`` at
    ``strength``). ``jitter`` moves the objects, so the scene drawn is returned."""
    if kind not in DEGRADATIONS:
        raise ValueError(f"degradation {kind!r} is not one of {tuple(DEGRADATIONS)}")
    levels = dict.fromkeys(("blur", "round", "ragged", "jitter", "color"), 0.0)
    if kind == "model":  # every kind at once, each up to its medium strength
        for k in levels:
            levels[k] = float(rng.uniform(0, DEGRADATIONS[k][1]))
    elif kind != "clean":
        levels[kind] = strength
    if levels["jitter"] > 0:
        moved = [tuple(rng.uniform(-1, 1, 2) * levels["jitter"]) for _ in scene.objects]
        objs = tuple(
            ShapeObject(o.shape, o.color, o.cell, o.size, j)  # type: ignore[arg-type]
            for o, j in zip(scene.objects, moved, strict=True)
        )
        scene = Scene(objs, scene.background, scene.word)
    img = render(Scene((), scene.background), size, size).astype(np.float32)
    for o in scene.objects:
        a = _alpha(o, size, rng, levels)[:, :, None]
        color = np.asarray(COLORS[o.color], np.float32) + rng.normal(0, levels["color"], 3)
        img = img * (1 - a) + np.clip(color, 0, 255) * a
    if levels["color"] > 0:
        img += rng.normal(0, levels["color"] / 2, img.shape).astype(np.float32)
    return scene, np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _reads(scene: Scene, image: np.ndarray, meta: tuple[int, str, float]) -> list[ShapeRead]:
    size = image.shape[0]
    found = detect_objects(image)  # largest first
    out = []
    for o in scene.objects:
        x0, y0, x1, y1 = object_box(o, size, size)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        half = (x1 - x0) / 2 + 1
        here = [
            d for d in found if abs(d.centroid[0] - cx) <= half and abs(d.centroid[1] - cy) <= half
        ]
        if not here:
            out.append(ShapeRead(*meta, o.shape, None, None, 0.0, False, False))
            continue
        d = here[0]
        second = sorted(d.shape_scores, key=d.shape_scores.__getitem__)[-2]
        out.append(
            ShapeRead(
                *meta, o.shape, d.shape, second, d.margin, d.color == o.color, d.cell == o.cell
            )
        )
    return out


def validate(
    n_scenes: int = 300,
    seed: int = 0,
    *,
    resolutions: Sequence[int] = RESOLUTIONS,
    degradations: dict[str, tuple[float, ...]] | None = None,
    shapes: Sequence[str] = SHAPES,
    backgrounds: str = "world",
) -> list[ShapeRead]:
    """Every object's read on ``n_scenes`` seeded scenes (1–3 objects of ``shapes``, all
    sizes and backgrounds) rendered at each resolution and degraded by each kind and
    strength. The same seed gives the same reads, and each (resolution, kind, strength,
    scene) its own random stream, so a subset of them reads as in the whole run.
    ``backgrounds="styled"``: the same scenes on the style stage's backgrounds, scene i's
    drawn from its own stream (module docstring)."""
    if backgrounds not in BACKGROUNDS:
        raise ValueError(f"backgrounds {backgrounds!r} is not one of {BACKGROUNDS}")
    degradations = DEGRADATIONS if degradations is None else degradations
    scene_rng = np.random.default_rng([seed, 0])
    scenes = [sample_scene(scene_rng, shapes=shapes, sizes=tuple(SIZES)) for _ in range(n_scenes)]
    if backgrounds == "styled":
        styles = [sample_style(np.random.default_rng([seed, 2, i])) for i in range(n_scenes)]
        scenes = [
            replace(sc, background=st.background()) for sc, st in zip(scenes, styles, strict=True)
        ]
    kind_ids = {k: i for i, k in enumerate(DEGRADATIONS)}
    reads: list[ShapeRead] = []
    for size in resolutions:
        for kind, strengths in degradations.items():
            for strength in strengths:
                key = [seed, 1, size, kind_ids[kind], round(strength * 1000)]
                for i, scene in enumerate(scenes):
                    rng = np.random.default_rng([*key, i])
                    drawn, image = degraded_render(scene, size, kind, strength, rng)
                    reads += _reads(drawn, image, (size, kind, strength))
    return reads


def calibration_reads(
    n_scenes: int = CALIBRATION_SCENES,
    seed: int = CALIBRATION_SEED,
    resolutions: Sequence[int] = RESOLUTIONS,
) -> list[ShapeRead]:
    """The reads ``detect.UNCLEAR_MARGIN`` was calibrated on (the "model" degradation)."""
    return validate(n_scenes, seed, resolutions=resolutions, degradations={"model": (1.0,)})


def confusion(
    reads: Iterable[ShapeRead], margin: float = UNCLEAR_MARGIN
) -> dict[str, dict[str, int]]:
    """``[true][read]`` counts; read is a shape, ``unclear`` (margin below ``margin``) or
    ``missed`` (no component at the object's place)."""
    out: dict[str, dict[str, int]] = {}
    for r in reads:
        read = "missed" if r.read_shape is None else r.read_shape
        if r.read_shape is not None and r.margin < margin:
            read = "unclear"
        row = out.setdefault(r.true_shape, {})
        row[read] = row.get(read, 0) + 1
    return out


def summarize(reads: Sequence[ShapeRead], margin: float = UNCLEAR_MARGIN) -> dict[str, float]:
    """Over the objects found: ``forced`` (forced-choice accuracy), ``decided`` (accuracy
    of the reads at or above ``margin``), ``unclear`` (share below it), ``passed`` (share
    read right and clear: the share of shape requirements that pass), and ``found``/``n``."""
    found = [r for r in reads if r.read_shape is not None]
    right = np.array([r.read_shape == r.true_shape for r in found], bool)
    clear = np.array([r.margin >= margin for r in found], bool)
    n = max(len(found), 1)
    return {
        "n": len(reads),
        "found": len(found),
        "forced": float(right.sum() / n),
        "decided": float((right & clear).sum() / max(int(clear.sum()), 1)),
        "unclear": float((~clear).sum() / n),
        "passed": float((right & clear).sum() / n),
    }


def calibrate_margin(
    reads: Sequence[ShapeRead], target: float = TARGET_ACCURACY, step: float = MARGIN_STEP
) -> float:
    """The smallest margin on a ``step`` grid at which the reads it decides (margin at or
    above it) are right at least ``target`` of the time."""
    found = [r for r in reads if r.read_shape is not None]
    margins = np.array([r.margin for r in found])
    right = np.array([r.read_shape == r.true_shape for r in found], bool)
    for k in range(round(1 / step) + 1):
        m = round(k * step, 6)
        clear = margins >= m  # as DetectedObject.clear_shape decides
        if not clear.any() or right[clear].mean() >= target:
            return m
    return 1.0
