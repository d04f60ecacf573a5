"""ShapesWorld: synthetic scenes with exact specs, captions, defects, a rubric verifier and
ShapesEval.

>>> import numpy as np
>>> from krea2.curate import shapes
>>> scene = shapes.sample_scene(np.random.default_rng(0))
>>> image = shapes.render(scene, 64, 64)            # (64, 64, 3) uint8 RGB
>>> shapes.verify(scene, image).score
1.0
"""

from __future__ import annotations

from krea2.curate.shapes.annotate import shapes_captioner, shapes_tagger
from krea2.curate.shapes.captions import captions
from krea2.curate.shapes.copies import COPY_EDITS
from krea2.curate.shapes.defects import (
    BORDER_COLOURS,
    DEFECT_CLASSES,
    OVERREPRESENTED,
    SEMANTIC_DUPLICATE,
    PoolItem,
    add_border,
    encode,
    make_pool,
    write_pool,
)
from krea2.curate.shapes.detect import UNCLEAR_MARGIN, DetectedObject, detect_objects
from krea2.curate.shapes.render import render
from krea2.curate.shapes.sample import sample_scene
from krea2.curate.shapes.shapes_eval import ShapesEvalScore, shapes_eval
from krea2.curate.shapes.spec import (
    BACKGROUND_COLORS,
    BACKGROUND_KINDS,
    CELLS,
    COLORS,
    SCENE_BACKGROUND_COLORS,
    SHAPES,
    SIZES,
    STYLE_BACKGROUND_COLORS,
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
from krea2.curate.shapes.world import (
    WORLD_BACKGROUNDS,
    WORLD_COLORS,
    WORLD_SHAPES,
    Concept,
    WorldSplit,
    concept_scene,
    eval_prompt,
    one_object_scenes,
    split_concepts,
)

__all__ = [
    "BACKGROUND_COLORS",
    "BACKGROUND_KINDS",
    "BORDER_COLOURS",
    "CELLS",
    "COLORS",
    "COPY_EDITS",
    "DEFECT_CLASSES",
    "OVERREPRESENTED",
    "SCENE_BACKGROUND_COLORS",
    "SEMANTIC_DUPLICATE",
    "SHAPES",
    "SIZES",
    "STYLE_BACKGROUND_COLORS",
    "UNCLEAR_MARGIN",
    "WORDS",
    "WORLD_BACKGROUNDS",
    "WORLD_COLORS",
    "WORLD_SHAPES",
    "Background",
    "Concept",
    "DetectedObject",
    "PoolItem",
    "Requirement",
    "RequirementResult",
    "Scene",
    "ShapeObject",
    "ShapesEvalScore",
    "Verification",
    "Word",
    "WorldSplit",
    "add_border",
    "captions",
    "concept_scene",
    "detect_objects",
    "encode",
    "eval_prompt",
    "make_pool",
    "one_object_scenes",
    "parse_prompt",
    "render",
    "sample_scene",
    "scene_requirements",
    "shapes_captioner",
    "shapes_eval",
    "shapes_tagger",
    "split_concepts",
    "verify",
    "write_pool",
]
