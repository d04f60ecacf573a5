"""ShapesWorld: synthetic scenes with exact specs, captions, defects, a rubric verifier and
ShapesEval.

>>> import numpy as np
>>> from krea2.curate import shapes
>>> scene = shapes.sample_scene(np.random.default_rng(0))
>>> image = shapes.render(scene, 64, 64)            # (64, 64, 3) uint8 RGB
>>> shapes.verify(scene, image).score
1.0

Styles (``StyleSpec``, ``sample_style``, ``apply_style``) and their measures
(``style_similarity``, ``classify_background``, ``leakage``) serve the style-reference
module; the toy CSD (``StyleEncoder``, ``train_style_encoder``) needs torch (the ``embed``
extra) and is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.curate.shapes.annotate import shapes_captioner, shapes_tagger
from krea2.curate.shapes.captions import captions, content_prompt
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
from krea2.curate.shapes.leakage import LeakageScore, leakage
from krea2.curate.shapes.render import render
from krea2.curate.shapes.sample import sample_scene
from krea2.curate.shapes.shapes_eval import ShapesEvalScore, shapes_eval
from krea2.curate.shapes.spec import (
    BACKGROUND_COLORS,
    BACKGROUND_KINDS,
    CELLS,
    COLORS,
    GRADIENT_DIRECTIONS,
    OBJECT_STYLES,
    SCENE_BACKGROUND_COLORS,
    SHAPES,
    SIZES,
    STYLE_BACKGROUND_COLORS,
    TEXTURE_FREQUENCIES,
    WORDS,
    Background,
    Scene,
    ShapeObject,
    Word,
)
from krea2.curate.shapes.style_measures import (
    BackgroundReading,
    StyleReading,
    StyleScore,
    background_pixels,
    classify_background,
    object_style_of,
    read_background,
    read_style,
    style_similarity,
)
from krea2.curate.shapes.styles import (
    STYLE_FREQUENCIES,
    StyleSpec,
    apply_style,
    sample_style,
    style_of,
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
from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types of the lazy exports (``X as X``: re-exported)
    from krea2.curate.shapes.style_encoder import StyleEncoder as StyleEncoder
    from krea2.curate.shapes.style_encoder import StyleEncoderConfig as StyleEncoderConfig
    from krea2.curate.shapes.style_encoder import train_style_encoder as train_style_encoder

# Names that need torch (the ``embed`` extra): imported on first use.
_LAZY: dict[str, str | None] = {
    "StyleEncoder": "style_encoder",
    "StyleEncoderConfig": "style_encoder",
    "train_style_encoder": "style_encoder",
}

__all__ = [
    "BACKGROUND_COLORS",
    "BACKGROUND_KINDS",
    "BORDER_COLOURS",
    "CELLS",
    "COLORS",
    "COPY_EDITS",
    "DEFECT_CLASSES",
    "GRADIENT_DIRECTIONS",
    "OBJECT_STYLES",
    "OVERREPRESENTED",
    "SCENE_BACKGROUND_COLORS",
    "SEMANTIC_DUPLICATE",
    "SHAPES",
    "SIZES",
    "STYLE_BACKGROUND_COLORS",
    "STYLE_FREQUENCIES",
    "TEXTURE_FREQUENCIES",
    "UNCLEAR_MARGIN",
    "WORDS",
    "WORLD_BACKGROUNDS",
    "WORLD_COLORS",
    "WORLD_SHAPES",
    "Background",
    "BackgroundReading",
    "Concept",
    "DetectedObject",
    "LeakageScore",
    "PoolItem",
    "Requirement",
    "RequirementResult",
    "Scene",
    "ShapeObject",
    "ShapesEvalScore",
    "StyleReading",
    "StyleScore",
    "StyleSpec",
    "Verification",
    "Word",
    "WorldSplit",
    "add_border",
    "apply_style",
    "background_pixels",
    "captions",
    "classify_background",
    "concept_scene",
    "content_prompt",
    "detect_objects",
    "encode",
    "eval_prompt",
    "leakage",
    "make_pool",
    "object_style_of",
    "one_object_scenes",
    "parse_prompt",
    "read_background",
    "read_style",
    "render",
    "sample_scene",
    "sample_style",
    "scene_requirements",
    "shapes_captioner",
    "shapes_eval",
    "shapes_tagger",
    "split_concepts",
    "style_of",
    "style_similarity",
    "verify",
    "write_pool",
    *_LAZY,
]

__getattr__ = lazy_exports(__name__, _LAZY)[0]


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
