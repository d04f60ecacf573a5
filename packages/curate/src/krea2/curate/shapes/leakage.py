"""Content leakage of a style-reference sample: reference objects and layout where the prompt
asked for other content.

A style-reference model should copy the reference's style and nothing else. ``leakage``
reads a sample with the rubric verifier's detector and reports (1) the reference's objects
(colour+shape) that the prompt did not ask for but the sample shows, and (2) how much the
sample's occupancy (where objects are) overlaps the reference's layout, beside the overlap
with the prompt's layout and with random layouts of as many objects (chance).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from krea2.curate.shapes.detect import UNCLEAR_MARGIN, DetectedObject, detect_objects
from krea2.curate.shapes.render import object_box
from krea2.curate.shapes.sample import sample_scene
from krea2.curate.shapes.spec import Scene
from krea2.curate.shapes.style_measures import check_image
from krea2.curate.shapes.verify import Requirement, check

CHANCE_LAYOUTS = 16  # random layouts averaged into LeakageScore.chance_iou


def scene_occupancy(scene: Scene, width: int, height: int) -> np.ndarray:
    """(height, width) bool: the union of the scene's object boxes (``render.object_box``,
    a shape's own bounding box) at that render size; ground truth from the spec."""
    mask = np.zeros((height, width), bool)
    for obj in scene.objects:
        x0, y0, x1, y1 = object_box(obj, width, height)
        mask[max(0, round(y0)) : round(y1), max(0, round(x0)) : round(x1)] = True
    return mask


def detected_occupancy(objects: list[DetectedObject], width: int, height: int) -> np.ndarray:
    """(height, width) bool: the union of the detected objects' bounding boxes."""
    mask = np.zeros((height, width), bool)
    for o in objects:
        x, y, w, h = o.bbox
        mask[y : y + h, x : x + w] = True
    return mask


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two bool masks of one shape (1.0 when both are empty)."""
    union = int(np.logical_or(a, b).sum())
    return float(np.logical_and(a, b).sum()) / union if union else 1.0


@cache
def chance_layouts(seed: int, objects: int, width: int, height: int) -> np.ndarray:
    """bool [CHANCE_LAYOUTS, height, width] (read-only; none for 0 objects): the occupancy
    of ``CHANCE_LAYOUTS`` random scenes of ``objects`` objects drawn in turn from one
    generator seeded ``seed``. Made once per (seed, objects, size), not per scored image."""
    rng = np.random.default_rng(seed)
    masks = [
        scene_occupancy(sample_scene(rng, min_objects=objects, max_objects=objects), width, height)
        for _ in range(CHANCE_LAYOUTS if objects else 0)
    ]
    out = np.stack(masks) if masks else np.zeros((0, height, width), bool)
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class LeakageScore:
    """``candidates``: the reference's (colour, shape) kinds the prompt does not ask for;
    ``leaked``: those the sample shows (detected, shape clear by the verifier's margin).
    ``reference_iou``/``prompt_iou``: IoU of the sample's occupancy (detected boxes) with
    the reference's and the prompt's layout (spec boxes); ``chance_iou``: its mean IoU with
    ``CHANCE_LAYOUTS`` seeded random layouts of as many objects as the reference has."""

    leaked: tuple[tuple[str, str], ...]
    candidates: tuple[tuple[str, str], ...]
    reference_iou: float
    prompt_iou: float
    chance_iou: float

    @property
    def leak_rate(self) -> float:
        """Share of the candidates that leaked (0.0 when there are none)."""
        return len(self.leaked) / len(self.candidates) if self.candidates else 0.0

    @property
    def layout_leak(self) -> float:
        """``reference_iou − chance_iou``: how far the layout follows the reference beyond
        chance (about 0 when it does not; a prompt whose layout overlaps the reference's
        raises ``reference_iou`` too, so read it beside ``prompt_iou``)."""
        return self.reference_iou - self.chance_iou


def leakage(
    pixels: np.ndarray,
    reference_scene: Scene,
    prompt_scene: Scene,
    *,
    seed: int = 0,
    unclear_margin: float = UNCLEAR_MARGIN,
) -> LeakageScore:
    """The ``LeakageScore`` of a (h, w, 3) uint8 sample made from ``prompt_scene``'s content
    and ``reference_scene``'s style; ``seed`` draws the chance layouts; ``unclear_margin``
    as in ``verify`` (an object of unclear shape leaks no shape)."""
    check_image(pixels)
    h, w = pixels.shape[:2]
    asked = {(o.color, o.shape) for o in prompt_scene.objects}
    candidates = tuple(
        dict.fromkeys(
            (o.color, o.shape) for o in reference_scene.objects if (o.color, o.shape) not in asked
        )
    )
    objects = detect_objects(pixels)
    reqs = [Requirement("object", c, s) for c, s in candidates]
    found = check(reqs, objects, None, unclear_margin=unclear_margin)
    leaked = tuple(
        (r.requirement.color or "", r.requirement.shape or "") for r in found if r.passed
    )
    occupied = detected_occupancy(objects, w, h)
    chance = [iou(occupied, m) for m in chance_layouts(seed, len(reference_scene.objects), w, h)]
    return LeakageScore(
        leaked,
        candidates,
        iou(occupied, scene_occupancy(reference_scene, w, h)),
        iou(occupied, scene_occupancy(prompt_scene, w, h)),
        float(np.mean(chance)) if chance else 0.0,
    )
