"""Random ShapesWorld scenes from a numpy Generator (deterministic for a seed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from krea2.curate.shapes.spec import (
    BACKGROUND_KINDS,
    COLORS,
    SCENE_BACKGROUND_COLORS,
    SHAPES,
    SIZES,
    WORDS,
    Background,
    Scene,
    ShapeObject,
    Word,
)


def sample_scene(
    rng: np.random.Generator,
    *,
    min_objects: int = 1,
    max_objects: int = 3,
    shapes: Sequence[str] = SHAPES,
    colors: Sequence[str] = tuple(COLORS),
    sizes: Sequence[str] = tuple(SIZES),
    backgrounds: Sequence[str] = BACKGROUND_KINDS,
    background_colors: Sequence[str] = SCENE_BACKGROUND_COLORS,
    word_prob: float = 0.0,
    jitter: float = 0.5,
) -> Scene:
    """Draw a scene: ``min_objects..max_objects`` shapes in distinct cells, a background of
    one of ``backgrounds``, and with probability ``word_prob`` a word in a free cell.

    Restricting ``shapes``/``colors``/``sizes`` gives the toy trainer's smaller worlds, e.g.
    ``sample_scene(rng, max_objects=1, shapes=("circle", "square", "triangle"),
    sizes=("large",), backgrounds=("solid",), background_colors=("black", "dark gray"))``.
    """
    n = int(rng.integers(min_objects, max_objects + 1))
    cells = rng.permutation(9)
    objects = tuple(
        ShapeObject(
            shape=str(rng.choice(list(shapes))),
            color=str(rng.choice(list(colors))),
            cell=int(cells[i]),
            size=str(rng.choice(list(sizes))),
            jitter=(float(rng.uniform(-jitter, jitter)), float(rng.uniform(-jitter, jitter))),
        )
        for i in range(n)
    )
    kind = str(rng.choice(list(backgrounds)))
    bg_colors = list(background_colors)
    color = str(rng.choice(bg_colors))
    others = [c for c in bg_colors if c != color] or bg_colors
    background = Background(
        kind=kind,
        color=color,
        color2=str(rng.choice(others)) if kind == "gradient" else None,
        direction=str(rng.choice(["vertical", "horizontal"])),
        seed=int(rng.integers(0, 2**31)),
    )
    word = None
    if n < 9 and rng.random() < word_prob:
        word = Word(str(rng.choice(list(WORDS))), int(cells[n]))
    return Scene(objects, background, word)
