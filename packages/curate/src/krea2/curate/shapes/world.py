"""The toy world: one-object scenes for pretraining, and the held-out prompts of ShapesEval.

Every (colour, shape, cell) combination is a "concept"; a fixed, seeded share of them
is held out of the raw pool entirely, so ShapesEval measures composition (a colour, a
shape and a position seen before, never together) rather than recall of training images.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from krea2.curate.shapes.captions import captions
from krea2.curate.shapes.spec import Background, Scene, ShapeObject
from krea2.curate.shapes.styles import apply_style, sample_style

# Red is the pool's over-represented concept (``defects.OVERREPRESENTED``); the toy world
# leaves it out so that rebalancing that concept never touches the one-object scenes.
WORLD_COLORS: tuple[str, ...] = ("green", "blue", "yellow", "purple", "orange", "cyan", "pink")
WORLD_SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
WORLD_BACKGROUNDS: tuple[str, ...] = ("black", "dark gray")

Concept = tuple[str, str, int]  # (colour, shape, cell)


@dataclass(frozen=True)
class WorldSplit:
    """Concepts for the pool (``train``) and for ShapesEval (``held_out``)."""

    train: tuple[Concept, ...]
    held_out: tuple[Concept, ...]


def split_concepts(seed: int, held_out_fraction: float = 0.15) -> WorldSplit:
    """Hold out a seeded share of all (colour, shape, cell) concepts, so that every colour,
    shape and cell still appears in training."""
    concepts = list(itertools.product(WORLD_COLORS, WORLD_SHAPES, range(9)))
    rng = np.random.default_rng(seed)
    n_held = round(held_out_fraction * len(concepts))
    for _ in range(1000):
        order = rng.permutation(len(concepts))
        held = {concepts[i] for i in order[:n_held]}
        train = [c for c in concepts if c not in held]
        covered = ({c for c, _, _ in train}, {s for _, s, _ in train}, {p for _, _, p in train})
        if covered == (set(WORLD_COLORS), set(WORLD_SHAPES), set(range(9))):
            break
    return WorldSplit(tuple(sorted(train)), tuple(sorted(held)))


def concept_scene(
    concept: Concept,
    background: str = "black",
    size: str = "large",
    jitter: tuple[float, float] = (0.0, 0.0),
) -> Scene:
    """The one-object scene of ``concept`` on a solid ``background``."""
    color, shape, cell = concept
    return Scene((ShapeObject(shape, color, cell, size, jitter),), Background("solid", background))


def eval_prompt(concept: Concept) -> str:
    """The ShapesEval prompt of a concept: its medium caption (colour, shape, position)."""
    return captions(concept_scene(concept))["medium"]


def one_object_scenes(
    split: WorldSplit,
    per_concept: int,
    seed: int,
    rerenders: int = 0,
    nudge: float = 0.05,
    styled: float = 0.0,
) -> list[Scene]:
    """``per_concept`` candidate scenes of every training concept: the first large and
    centred, the others of random size (large or medium), jitter and background. Each is
    followed by ``rerenders`` near-identical re-renders, its shape moved by at most
    ``nudge`` of the jitter range per axis (under a pixel at 320 px for large shapes).
    A share ``styled`` of the takes (and their re-renders) draw a gradient or texture
    background of ``sample_style``'s colours instead of a world background, so a model
    trained on them can draw what a style reference shows. The candidates themselves do
    not depend on ``rerenders``, and the unstyled ones not on ``styled``."""
    if not 0 <= styled <= 1:
        raise ValueError(f"styled={styled} must be a share in [0, 1]")
    rng = np.random.default_rng(seed)
    nudges = np.random.default_rng([seed, 1])
    styles = np.random.default_rng([seed, 2])  # its own stream: the other draws stay put
    scenes: list[Scene] = []
    for concept in split.train:
        for attempt in range(per_concept):
            size = "large" if attempt == 0 else str(rng.choice(["large", "medium"]))
            jitter = (0.0, 0.0) if attempt == 0 else tuple(rng.uniform(-0.5, 0.5, 2))
            background = str(rng.choice(WORLD_BACKGROUNDS))
            style = None
            if styled > 0 and styles.random() < styled:
                style = sample_style(styles, kinds=("gradient", "texture"),
                                     object_styles=("filled",))  # fmt: skip
            takes = [jitter]
            for _ in range(rerenders):
                takes.append(
                    tuple(float(np.clip(j + nudges.uniform(-nudge, nudge), -1, 1)) for j in jitter)
                )
            for offset in takes:
                scene = concept_scene(concept, background, size, offset)
                scenes.append(scene if style is None else apply_style(scene, style))
    return scenes
