"""Synthetic user prompts from ShapesWorld scenes: short requests that drop details on purpose.

The expander learns the inverse of what users do: they type a short, loose request; the
training caption (the long caption of the same scene) is the detailed prompt the DiT was
trained on. Because ShapesWorld captions follow a grammar that `krea2.curate.shapes.parse_prompt`
inverts, every synthetic prompt knows exactly which requirements it *kept* (the parse of its
own text) and which it *dropped* (the scene's other requirements), so faithfulness of an
expansion to the request is verifiable (`krea2.expander.faithfulness`).

>>> import numpy as np
>>> from krea2.curate import shapes
>>> scene = shapes.sample_scene(np.random.default_rng(3), word_prob=0.5)
>>> p = user_prompt(scene, np.random.default_rng(0))
>>> set(p.kept) <= set(shapes.scene_requirements(scene))
True
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from krea2.curate.shapes import (
    CELLS,
    Requirement,
    Scene,
    captions,
    parse_prompt,
    scene_requirements,
)

__all__ = [
    "TARGET_FORMATS",
    "PromptStyle",
    "UserPrompt",
    "UserPromptConfig",
    "scene_weight",
    "user_prompt",
]

# Caption formats an expansion can take: the detailed ones (the short and tag formats name
# no positions, so they could not keep a request's "in the top left").
TARGET_FORMATS = ("long", "medium")

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

PREPOSITIONS = {"left": "on", "right": "on", "top": "at", "bottom": "at"}  # else "in"

# Openers per register. None may contain a colour, a shape, "and", "with" or a cell name:
# the verifier's grammar must read only the requested content.
OPENERS: dict[str, tuple[str, ...]] = {
    "terse": ("", ""),
    "conversational": ("can you draw ", "hey, could you make ", "i'd love ", "show me "),
    "instruction": ("Make an image of ", "Generate ", "Draw ", "Create a picture of "),
}
CLOSERS: dict[str, tuple[str, ...]] = {
    "terse": ("",),
    "conversational": ("?", " please", ", thanks!", ""),
    "instruction": (".", "", ". Keep it simple."),
}


@dataclass(frozen=True)
class UserPromptConfig:
    """How much a synthetic request drops. Probabilities are per mention.

    ``mention_kind``: each colour+shape kind of the scene is named (at least one always is).
    ``keep_position``: a named single object gets its cell ("in the top left").
    ``keep_count``: a named kind with several objects gets its number ("two red circles");
    otherwise it is named in the plural without a number.
    ``keep_total``: the request states the number of shapes.
    ``keep_word``: the rendered word is asked for.
    ``keep_background``: the background colour is mentioned (not a verified requirement).
    ``styles``: registers and their weights (terse tags, conversational, instruction).
    ``target``: the caption format the expander learns to write (`captions`' keys): the
    one the DiT reads best. The report's DiT reads long captions; the toy demo's word
    conditioner reads 12 words, so its expander writes the ``medium`` format.
    """

    mention_kind: float = 0.7
    keep_position: float = 0.3
    keep_count: float = 0.6
    keep_total: float = 0.1
    keep_word: float = 0.6
    keep_background: float = 0.2
    styles: dict[str, float] = field(
        default_factory=lambda: {"terse": 0.3, "conversational": 0.4, "instruction": 0.3}
    )
    target: str = "long"

    def __post_init__(self) -> None:
        if self.target not in TARGET_FORMATS:
            raise ValueError(f"target {self.target!r}: one of {', '.join(TARGET_FORMATS)}")
        for name in ("mention_kind", "keep_position", "keep_count", "keep_total", "keep_word"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} = {value} is a probability: use 0..1")
        unknown = set(self.styles) - set(OPENERS)
        if unknown or not self.styles or min(self.styles.values()) < 0:
            raise ValueError(f"styles {self.styles}: weights >= 0 over {sorted(OPENERS)}")


PromptStyle = str


@dataclass(frozen=True)
class UserPrompt:
    """A synthetic request, what it kept and dropped, its thinking trace and its target.

    ``kept``: requirements the request states (its own parse). ``dropped``: the scene's
    requirements it does not state. ``target``: the caption the expander should write
    (``UserPromptConfig.target``'s format).
    """

    text: str
    style: PromptStyle
    kept: tuple[Requirement, ...]
    dropped: tuple[Requirement, ...]
    thinking: str
    target: str


def _article(words: str) -> str:
    return "an" if words[0] in "aeiou" else "a"


def _kind_phrase(color: str, shape: str, n: int, cell: int | None, rng, cfg) -> str:
    if n == 1:
        phrase = f"{_article(color)} {color} {shape}"
        if cell is not None and rng.random() < cfg.keep_position:
            name = CELLS[cell]
            phrase += f" {PREPOSITIONS.get(name, 'in')} the {name}"
        return phrase
    if rng.random() < cfg.keep_count:
        return f"{NUMBER_WORDS[n]} {color} {shape}s"
    return f"{color} {shape}s"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def user_prompt(
    scene: Scene, rng: np.random.Generator, cfg: UserPromptConfig | None = None
) -> UserPrompt:
    """A short request for ``scene`` that names some of its content and drops the rest."""
    cfg = cfg or UserPromptConfig()
    kinds = Counter((o.color, o.shape) for o in scene.objects)
    cell_of = {(o.color, o.shape): o.cell for o in scene.objects}
    order = sorted(kinds)
    named = [k for k in order if rng.random() < cfg.mention_kind]
    if not named:
        named = [order[int(rng.integers(len(order)))]]
    parts = [_kind_phrase(c, s, kinds[(c, s)], cell_of[(c, s)], rng, cfg) for c, s in named]
    rng.shuffle(parts)
    body = _join(parts)
    if rng.random() < cfg.keep_total:
        n = len(scene.objects)
        body = f"{NUMBER_WORDS[n]} shape{'s' if n > 1 else ''}: {body}"
    if scene.word is not None and rng.random() < cfg.keep_word:
        body += f' with the word "{scene.word.text}"'
    if rng.random() < cfg.keep_background:
        body += f", {scene.background.color} background"
    styles = sorted(cfg.styles)
    weights = np.array([cfg.styles[s] for s in styles], dtype=float)
    style = styles[int(rng.choice(len(styles), p=weights / weights.sum()))]
    opener = OPENERS[style][int(rng.integers(len(OPENERS[style])))]
    closer = CLOSERS[style][int(rng.integers(len(CLOSERS[style])))]
    text = opener + body + closer
    if style == "instruction":
        text = text[0].upper() + text[1:]
    kept = tuple(parse_prompt(text))
    everything = scene_requirements(scene)
    dropped = tuple(r for r in everything if r not in kept and not _implied(r, kept))
    return UserPrompt(
        text=text,
        style=style,
        kept=kept,
        dropped=dropped,
        thinking=thinking_trace(text, kept, dropped, scene),
        target=stated_target(captions(scene)[cfg.target], kept),
    )


def stated_target(caption: str, kept: tuple[Requirement, ...]) -> str:
    """``caption`` made faithful to the request: a count or total the request states and
    the caption only implies (the medium caption lists two red circles one by one, and
    never says "one shape") goes first in the request's words ("Two red circles. A red
    circle ..."), so SFT never teaches the expander to drop what the user asked for."""
    said = set(parse_prompt(caption))
    missing = [r for r in kept if r.kind in ("total", "count") and r not in said]
    if not missing:
        return caption
    phrases = [
        f"{NUMBER_WORDS[r.count or 0]} shape{'s' if r.count != 1 else ''}"
        if r.kind == "total"
        else f"{NUMBER_WORDS[r.count or 0]} {r.color} {r.shape}{'s' if r.count != 1 else ''}"
        for r in sorted(missing, key=lambda r: r.kind != "total")
    ]
    head = ", ".join(phrases)
    return f"{head[0].upper()}{head[1:]}. {caption}"


def _implied(r: Requirement, kept: tuple[Requirement, ...]) -> bool:
    # "a red circle" states the count of red circles is one only loosely; the scene's
    # count-1 requirement is implied by the object requirement, not dropped.
    return r.kind == "count" and r.count == 1 and Requirement("object", r.color, r.shape) in kept


def thinking_trace(
    text: str, kept: tuple[Requirement, ...], dropped: tuple[Requirement, ...], scene: Scene
) -> str:
    """A short reasoning trace that reconstructs the intent: what was asked, what is left
    open (the plan for what the expansion adds), and the rule: keep the asked, choose the rest."""
    placed = {(r.color, r.shape) for r in kept if r.kind in ("position", "count")}
    shown = [
        r
        for r in kept
        if not (r.kind == "object" and (r.color, r.shape) in placed)
        and not (r.kind == "count" and r.count == 1)
    ]
    asked = "; ".join(r.describe() for r in shown) or "nothing specific"
    open_parts = []
    if any(r.kind == "position" for r in dropped):
        open_parts.append("where the shapes go")
    if any(r.kind in ("object", "count") for r in dropped):
        open_parts.append("whether other shapes join them")
    open_parts.append("the sizes")
    if "background" not in text:
        open_parts.append("the background")
    if scene.word is not None and not any(r.kind == "word" for r in kept):
        open_parts.append("any lettering")
    # Short on purpose: a trace is trained on and generated for every request, and its
    # job is to restate the intent and plan what to add, not to be an essay.
    return (
        f"The user asks for: {asked}. Open: {_join(open_parts)}. "
        "Keep what was asked exactly; choose the rest."
    )


def scene_weight(scene: Scene, rich: float = 2.0) -> float:
    """Sampling weight of a scene for SFT data: the report oversamples visually rich,
    artistic captions; on ShapesWorld "rich" is several shapes, a gradient or textured
    background, or a rendered word (weight ``rich``), else 1."""
    is_rich = len(scene.objects) > 1 or scene.background.kind != "solid" or scene.word is not None
    return rich if is_rich else 1.0
