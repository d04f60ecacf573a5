"""ShapesWorld scene specs: objects on a 3×3 grid, a background and an optional word, as JSON."""

from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")

# Object colours: saturated and bright, so they are far (RGB distance > 100) from each other
# and from every background colour; white is reserved for rendered words.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 90, 230),
    "yellow": (240, 215, 40),
    "purple": (150, 60, 205),
    "orange": (250, 140, 20),
    "cyan": (40, 205, 215),
    "pink": (250, 130, 190),
}

# Background colours: dark, low saturation.
BACKGROUND_COLORS: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "dark gray": (60, 60, 60),
    "navy": (18, 24, 66),
    "dark brown": (62, 42, 26),
    "dark green": (18, 56, 34),
    # Style colours: renderable and captioned, never drawn by the world's scenes (see
    # SCENE_BACKGROUND_COLORS), so a model pretrained on the world has never seen them:
    # the domain SFT styles of krea2.pipeline.sft_merge.
    "maroon": (96, 16, 40),
    "teal": (10, 84, 90),
}
# The background colours random scenes are drawn from (sample_scene), and the rest.
SCENE_BACKGROUND_COLORS: tuple[str, ...] = (
    "black",
    "dark gray",
    "navy",
    "dark brown",
    "dark green",
)
STYLE_BACKGROUND_COLORS: tuple[str, ...] = ("maroon", "teal")
BACKGROUND_KINDS: tuple[str, ...] = ("solid", "gradient", "texture")
GRADIENT_DIRECTIONS: tuple[str, ...] = ("vertical", "horizontal")
# Side of the texture's coarse noise grid: higher is finer (6 is the world's texture).
TEXTURE_FREQUENCIES: tuple[int, int] = (2, 32)
# How objects are drawn: filled, or as a thick outline (stroke = OUTLINE_STROKE × the
# shape's side) whose inside shows the background.
OBJECT_STYLES: tuple[str, ...] = ("filled", "outlined")
TEXT_COLOR: tuple[int, int, int] = (255, 255, 255)

# Shape side as a share of the cell's shorter side.
SIZES: dict[str, float] = {"small": 0.6, "medium": 0.75, "large": 0.9}

# Cells of the 3×3 grid, row-major; index = 3·row + column.
CELLS: tuple[str, ...] = (
    "top left",
    "top",
    "top right",
    "left",
    "center",
    "right",
    "bottom left",
    "bottom",
    "bottom right",
)

WORDS: tuple[str, ...] = ("SUN", "CAT", "KREA", "MOON", "TREE", "BOX", "STAR", "HELLO", "RAIN")


@dataclass(frozen=True)
class ShapeObject:
    """One shape: ``cell`` indexes ``CELLS``; ``jitter`` moves it off the cell centre by a
    share (−1..1, per axis) of the free margin."""

    shape: str
    color: str
    cell: int
    size: str = "large"
    jitter: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r} is not one of {SHAPES}")
        if self.color not in COLORS:
            raise ValueError(f"color {self.color!r} is not one of {tuple(COLORS)}")
        if not 0 <= self.cell < 9:
            raise ValueError(f"cell {self.cell} is not in 0..8")
        if self.size not in SIZES:
            raise ValueError(f"size {self.size!r} is not one of {tuple(SIZES)}")

    @property
    def position(self) -> str:
        return CELLS[self.cell]


@dataclass(frozen=True)
class Background:
    """``solid`` uses ``color``; ``gradient`` blends ``color`` → ``color2`` along ``direction``
    (``vertical`` or ``horizontal``); ``texture`` adds smooth low-amplitude noise from
    ``seed`` to ``color``, drawn on a coarse ``frequency`` × ``frequency`` grid (2..32;
    higher is finer) and smoothly upsampled."""

    kind: str = "solid"
    color: str = "black"
    color2: str | None = None
    direction: str = "vertical"
    seed: int = 0
    frequency: int = 6

    def __post_init__(self) -> None:
        if self.kind not in BACKGROUND_KINDS:
            raise ValueError(f"background kind {self.kind!r} is not one of {BACKGROUND_KINDS}")
        if self.direction not in GRADIENT_DIRECTIONS:
            raise ValueError(
                f"gradient direction {self.direction!r} is not one of {GRADIENT_DIRECTIONS}"
            )
        lo, hi = TEXTURE_FREQUENCIES
        if isinstance(self.frequency, bool) or not isinstance(self.frequency, numbers.Integral):
            raise ValueError(f"texture frequency {self.frequency!r} is not an int in {lo}..{hi}")
        object.__setattr__(self, "frequency", int(self.frequency))  # numpy ints → JSON-able
        if not lo <= self.frequency <= hi:
            raise ValueError(f"texture frequency {self.frequency} is not in {lo}..{hi}")
        for c in (self.color, self.color2):
            if c is not None and c not in BACKGROUND_COLORS:
                raise ValueError(f"background color {c!r} is not one of {tuple(BACKGROUND_COLORS)}")
        if self.kind == "gradient" and self.color2 is None:
            raise ValueError("a gradient background needs color2")


@dataclass(frozen=True)
class Word:
    """A rendered word in white, centred in ``cell`` (which holds no shape)."""

    text: str
    cell: int


@dataclass(frozen=True)
class Scene:
    """A ShapesWorld scene: 1–9 objects in distinct cells, a background, an optional word;
    ``object_style`` (one of ``OBJECT_STYLES``) says how every object is drawn."""

    objects: tuple[ShapeObject, ...]
    background: Background = field(default_factory=Background)
    word: Word | None = None
    object_style: str = "filled"

    def __post_init__(self) -> None:
        cells = [o.cell for o in self.objects] + ([self.word.cell] if self.word else [])
        if len(set(cells)) != len(cells):
            raise ValueError(f"objects and word must occupy distinct cells, got {cells}")
        if self.object_style not in OBJECT_STYLES:
            raise ValueError(f"object style {self.object_style!r} is not one of {OBJECT_STYLES}")

    def to_dict(self) -> dict[str, Any]:
        """The scene as JSON-ready data. The style fields added after the first release
        (``background.frequency``, ``object_style``) are left out at their defaults, so a
        scene that does not use them has the same JSON (captions, pool metadata) as before."""
        d = asdict(self)
        for key, default in _LATER_DEFAULTS["background"].items():
            if d["background"][key] == default:
                del d["background"][key]
        for key, default in _LATER_DEFAULTS["scene"].items():
            if d[key] == default:
                del d[key]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scene:
        objects = tuple(
            ShapeObject(
                o["shape"],
                o["color"],
                int(o["cell"]),
                o.get("size", "large"),
                tuple(o.get("jitter", (0.0, 0.0))),
            )  # type: ignore[arg-type]
            for o in d["objects"]
        )
        background = Background(**d.get("background", {}))
        word = Word(**d["word"]) if d.get("word") else None
        return cls(objects, background, word, d.get("object_style", "filled"))

    @classmethod
    def from_json(cls, text: str) -> Scene:
        return cls.from_dict(json.loads(text))


# Fields added after the first release, with the defaults that reproduce it (Scene.to_dict).
_LATER_DEFAULTS: dict[str, dict[str, Any]] = {
    "background": {"frequency": 6},
    "scene": {"object_style": "filled"},
}
