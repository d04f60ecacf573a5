"""Captions of a ShapesWorld scene in the five training formats: long, medium, short, tags, json."""

from __future__ import annotations

from collections import Counter

from krea2.curate.shapes.spec import CELLS, Background, Scene, ShapeObject

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def plural(shape: str, n: int) -> str:
    return shape if n == 1 else shape + "s"


def where(cell: int) -> str:
    """Prepositional phrase for a grid cell: "in the top left", "on the right", "at the top"."""
    name = CELLS[cell]
    if name in ("left", "right"):
        return f"on the {name}"
    if name in ("top", "bottom"):
        return f"at the {name}"
    return f"in the {name}"


def background_phrase(bg: Background) -> str:
    if bg.kind == "gradient":
        return f"a {bg.direction} gradient background from {bg.color} to {bg.color2}"
    if bg.kind == "texture":
        return f"a softly textured {bg.color} background"
    return f"a plain {bg.color} background"


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _object(obj: ShapeObject, with_size: bool) -> str:
    words = f"{obj.size} {obj.color} {obj.shape}" if with_size else f"{obj.color} {obj.shape}"
    return f"{_article(words)} {words}"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _reading_order(scene: Scene) -> list[ShapeObject]:
    return sorted(scene.objects, key=lambda o: o.cell)


def long_caption(scene: Scene) -> str:
    """Dense description: count, every object with size, colour, shape and cell, counts per
    kind, the background and the word."""
    objs = _reading_order(scene)
    n = len(objs)
    parts = [
        f"The image shows {NUMBER_WORDS[n]} {plural('shape', n)}{_drawn(scene, ' ')} on "
        f"{background_phrase(scene.background)}."
    ]
    parts += [f"{where(o.cell).capitalize()} there is {_object(o, True)}." for o in objs]
    kinds = Counter((o.color, o.shape) for o in objs)
    if any(c > 1 for c in kinds.values()):
        counted = [
            f"{NUMBER_WORDS[c]} {color} {plural(shape, c)}"
            for (color, shape), c in sorted(kinds.items())
        ]
        parts.append(f"In total there are {_join(counted)}.")
    if scene.word is not None:
        parts.append(f'The word "{scene.word.text}" is written in white {where(scene.word.cell)}.')
    return " ".join(parts)


def _placed_objects(scene: Scene) -> str:
    """ "A red circle in the top left and a blue square at the bottom" (reading order)."""
    return _join([f"{_object(o, False)} {where(o.cell)}" for o in _reading_order(scene)])


def _drawn(scene: Scene, sep: str) -> str:
    """How the objects are drawn, when not filled (filled scenes' captions are unchanged)."""
    return f"{sep}drawn as outlines" if scene.object_style == "outlined" else ""


def _word_clause(scene: Scene) -> str:
    return f', with the word "{scene.word.text}"' if scene.word is not None else ""


def medium_caption(scene: Scene) -> str:
    """One sentence: objects with colour, shape and cell, then the background."""
    text = f"{_placed_objects(scene).capitalize()}{_drawn(scene, ', ')}, on "
    text += background_phrase(scene.background)
    return text + _word_clause(scene) + "."


def content_prompt(scene: Scene) -> str:
    """The medium caption without a word about style: objects with colour, shape and cell,
    and the word, but neither the background nor how objects are drawn ("A red circle in
    the top left and a blue square at the bottom."). The prompt of a style-reference
    sample, whose style must come from the reference image."""
    return _placed_objects(scene).capitalize() + _word_clause(scene) + "."


def short_caption(scene: Scene) -> str:
    """Colours and shapes only, grouped with counts."""
    kinds = Counter((o.color, o.shape) for o in scene.objects)
    items = [
        f"{_article(color)} {color} {shape}" if c == 1 else f"{NUMBER_WORDS[c]} {color} {shape}s"
        for (color, shape), c in sorted(kinds.items())
    ]
    return _join(items).capitalize()


def tags_caption(scene: Scene) -> str:
    """Comma-separated tags: each colour+shape, the shape count, the background."""
    kinds = sorted({f"{o.color} {o.shape}" for o in scene.objects})
    n = len(scene.objects)
    tags = [*kinds, f"{n} {plural('shape', n)}", f"{scene.background.color} background"]
    tags.append(f"{scene.background.kind} background")
    if scene.object_style == "outlined":
        tags.append("outlined shapes")
    if scene.word is not None:
        tags.append(f'word "{scene.word.text}"')
    return ", ".join(tags)


def captions(scene: Scene) -> dict[str, str]:
    """All five formats, keyed by ``krea2.infra.shards.CAPTION_FORMATS`` names."""
    return {
        "long": long_caption(scene),
        "medium": medium_caption(scene),
        "short": short_caption(scene),
        "tags": tags_caption(scene),
        "json": scene.to_json(),
    }
