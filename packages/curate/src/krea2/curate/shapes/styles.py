"""Styles independent of content: a background and an object-drawing style, applied to any scene.

A style reference module learns to take its style from a reference image and its content
from the prompt; these are the styles it is trained and measured on. A ``StyleSpec`` is
everything about a scene that is not its objects or word; ``apply_style`` puts one on a
scene, ``style_of`` reads it back, ``sample_style`` draws one.

>>> import numpy as np
>>> from krea2.curate.shapes import apply_style, sample_scene, sample_style, style_of
>>> rng = np.random.default_rng(0)
>>> style = sample_style(rng)
>>> scene = apply_style(sample_scene(rng), style)
>>> style_of(scene) == style
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from krea2.curate.shapes.spec import (
    BACKGROUND_COLORS,
    BACKGROUND_KINDS,
    GRADIENT_DIRECTIONS,
    OBJECT_STYLES,
    Background,
    Scene,
)

# The texture frequencies sample_style draws from (inclusive). Below 3 a texture is a
# near-linear ramp of at most 2 × 14 grey levels: a faint gradient, not a texture.
STYLE_FREQUENCIES: tuple[int, int] = (3, 12)


@dataclass(frozen=True)
class StyleSpec:
    """A scene's style: its background (``kind``, ``color``, ``color2`` and ``direction``
    for gradients, ``frequency`` and ``seed`` for textures; see ``spec.Background``) and
    ``object_style`` (``filled`` or ``outlined``). Validated like the scene it makes."""

    kind: str = "solid"
    color: str = "black"
    color2: str | None = None
    direction: str = "vertical"
    frequency: int = 6
    seed: int = 0
    object_style: str = "filled"

    def __post_init__(self) -> None:
        self.background()  # raises ValueError naming a bad background field
        if self.object_style not in OBJECT_STYLES:
            raise ValueError(f"object style {self.object_style!r} is not one of {OBJECT_STYLES}")

    def background(self) -> Background:
        """The ``Background`` this style draws."""
        return Background(
            self.kind, self.color, self.color2, self.direction, self.seed, self.frequency
        )


def sample_style(
    rng: np.random.Generator,
    *,
    colors: Sequence[str] = tuple(BACKGROUND_COLORS),
    kinds: Sequence[str] = BACKGROUND_KINDS,
    object_styles: Sequence[str] = OBJECT_STYLES,
    frequencies: tuple[int, int] = STYLE_FREQUENCIES,
) -> StyleSpec:
    """Draw a style: a background kind of ``kinds`` in a colour of ``colors`` (a gradient
    goes to another one of them, in a random direction; a texture has a frequency in
    ``frequencies``, inclusive, and a random seed) and an object style of ``object_styles``.
    Fields a kind does not use keep their defaults, so two equal-looking styles are equal."""
    if not colors or not kinds or not object_styles:
        raise ValueError("sample_style needs at least one colour, kind and object style")
    kind = str(rng.choice(list(kinds)))
    color = str(rng.choice(list(colors)))
    color2, direction, frequency, seed = None, "vertical", 6, 0  # the unused fields' defaults
    if kind == "gradient":
        others = [c for c in colors if c != color]
        if not others:
            raise ValueError(f"a gradient needs two background colours, got {list(colors)}")
        color2 = str(rng.choice(others))
        direction = str(rng.choice(list(GRADIENT_DIRECTIONS)))
    elif kind == "texture":
        frequency = int(rng.integers(frequencies[0], frequencies[1] + 1))
        seed = int(rng.integers(0, 2**31))
    object_style = str(rng.choice(list(object_styles)))
    return StyleSpec(kind, color, color2, direction, frequency, seed, object_style)


def apply_style(scene: Scene, style: StyleSpec) -> Scene:
    """``scene``'s objects and word drawn in ``style``."""
    return replace(scene, background=style.background(), object_style=style.object_style)


def style_of(scene: Scene) -> StyleSpec:
    """The style of ``scene`` (its background's fields as they are, unused ones included)."""
    bg = scene.background
    return StyleSpec(
        bg.kind, bg.color, bg.color2, bg.direction, bg.frequency, bg.seed, scene.object_style
    )
