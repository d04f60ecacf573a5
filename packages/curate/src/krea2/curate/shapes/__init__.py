"""ShapesWorld: synthetic scenes with exact specs, captions, defects and a rubric verifier.

>>> import numpy as np
>>> from krea2.curate import shapes
>>> scene = shapes.sample_scene(np.random.default_rng(0))
>>> image = shapes.render(scene, 64, 64)            # (64, 64, 3) uint8 RGB
>>> shapes.verify(scene, image).score
1.0
"""

from __future__ import annotations

from krea2.curate.shapes.analyze import DetectedObject, analyze
from krea2.curate.shapes.captions import captions
from krea2.curate.shapes.render import render
from krea2.curate.shapes.sample import sample_scene
from krea2.curate.shapes.spec import (
    BACKGROUND_COLORS,
    BACKGROUND_KINDS,
    CELLS,
    COLORS,
    SHAPES,
    SIZES,
    WORDS,
    Background,
    Scene,
    ShapeObject,
    Word,
)
from krea2.curate.shapes.verify import (
    Requirement,
    RequirementResult,
    Verification,
    parse_prompt,
    scene_requirements,
    verify,
)

__all__ = [
    "BACKGROUND_COLORS",
    "BACKGROUND_KINDS",
    "CELLS",
    "COLORS",
    "SHAPES",
    "SIZES",
    "WORDS",
    "Background",
    "DetectedObject",
    "Requirement",
    "RequirementResult",
    "Scene",
    "ShapeObject",
    "Verification",
    "Word",
    "analyze",
    "captions",
    "parse_prompt",
    "render",
    "sample_scene",
    "scene_requirements",
    "verify",
]
