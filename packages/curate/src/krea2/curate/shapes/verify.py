"""The rubric verifier: a prompt or scene becomes requirements, each checked on an image."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from krea2.curate.shapes.captions import NUMBER_WORDS, plural, where
from krea2.curate.shapes.detect import (
    COLOR_DISTANCE,
    UNCLEAR_MARGIN,
    DetectedObject,
    detect_objects,
)
from krea2.curate.shapes.spec import CELLS, COLORS, SHAPES, Scene

if TYPE_CHECKING:
    from krea2.curate.ocr import OcrEngine


@dataclass(frozen=True)
class Requirement:
    """One verifiable claim. ``kind``: ``object`` (colour+shape present), ``position``
    (colour+shape in ``cell``), ``count`` (exactly ``count`` of colour+shape), ``total``
    (exactly ``count`` shapes in all) or ``word`` (``word`` is written)."""

    kind: str
    color: str | None = None
    shape: str | None = None
    cell: int | None = None
    count: int | None = None
    word: str | None = None

    def describe(self) -> str:
        thing = f"{self.color} {self.shape}"
        article = "an" if thing[0] in "aeiou" else "a"
        if self.kind == "object":
            return f"{article} {thing}"
        if self.kind == "position":
            return f"{article} {thing} {where(self.cell or 0)}"
        if self.kind == "count":
            return f"exactly {self.count} {self.color} {plural(self.shape or '', self.count or 0)}"
        if self.kind == "total":
            return f"exactly {self.count} {plural('shape', self.count or 0)}"
        return f'the word "{self.word}"'


@dataclass(frozen=True)
class RequirementResult:
    requirement: Requirement
    passed: bool
    detail: str


def _share(results: tuple[RequirementResult, ...]) -> float:
    return sum(r.passed for r in results) / len(results) if results else 1.0


def _by_kind(results: tuple[RequirementResult, ...]) -> dict[str, float]:
    groups: dict[str, list[bool]] = {}
    for r in results:
        groups.setdefault(r.requirement.kind, []).append(r.passed)
    return {k: sum(v) / len(v) for k, v in groups.items()}


@dataclass(frozen=True)
class Verification:
    """Per-requirement results; ``score`` is the share passed (1.0 for no requirements).

    An object whose shape is unclear (its best template wins by less than
    ``unclear_margin``) meets no requirement that names a shape. ``forced_results`` are the
    same requirements read the old way, every object taken as its best shape
    (``score_forced``; kept beside ``score`` for one release)."""

    results: tuple[RequirementResult, ...]
    objects: tuple[DetectedObject, ...] = field(default=())
    forced_results: tuple[RequirementResult, ...] | None = None
    unclear_margin: float = 0.0

    @property
    def score(self) -> float:
        return _share(self.results)

    @property
    def score_forced(self) -> float:
        return _share(self.results if self.forced_results is None else self.forced_results)

    @property
    def unclear(self) -> tuple[DetectedObject, ...]:
        """The objects whose shape is unclear."""
        return tuple(o for o in self.objects if o.clear_shape(self.unclear_margin) is None)

    def by_kind(self) -> dict[str, float]:
        """Mean pass rate per requirement kind (the sub-scores of the reward)."""
        return _by_kind(self.results)

    def by_kind_forced(self) -> dict[str, float]:
        """``by_kind`` of the forced-choice reads."""
        return _by_kind(self.results if self.forced_results is None else self.forced_results)


def scene_requirements(scene: Scene) -> list[Requirement]:
    """Every requirement a scene implies: each object's colour+shape and cell, the count of
    each colour+shape, the total count, and the word."""
    reqs = [Requirement("object", o.color, o.shape) for o in scene.objects]
    reqs += [Requirement("position", o.color, o.shape, o.cell) for o in scene.objects]
    kinds = Counter((o.color, o.shape) for o in scene.objects)
    reqs += [Requirement("count", c, s, count=n) for (c, s), n in sorted(kinds.items())]
    reqs.append(Requirement("total", count=len(scene.objects)))
    if scene.word is not None:
        reqs.append(Requirement("word", word=scene.word.text))
    return _unique(reqs)


def _unique(reqs: list[Requirement]) -> list[Requirement]:
    # Two red circles give two identical "object" requirements; checking one is enough.
    return list(dict.fromkeys(reqs))


_NUMBER = {w: i for i, w in enumerate(NUMBER_WORDS)} | {"a": 1, "an": 1}
_COLOR = "|".join(sorted(COLORS, key=len, reverse=True))
_SHAPE = "|".join(SHAPES)
_CELL_NAMES = {name: i for i, name in enumerate(CELLS)} | {"middle": 4, "centre": 4}
_CELL = "|".join(sorted((re.escape(n) for n in _CELL_NAMES), key=len, reverse=True))
_COUNT = r"(?:\d+|" + "|".join(_NUMBER) + ")"
_OBJECT_RE = re.compile(
    rf"(?:\b(?P<n>{_COUNT})\s+)?(?:(?:small|medium|large|big|tiny)\s+)?"
    rf"\b(?P<color>{_COLOR})\s+(?P<shape>{_SHAPE})(?P<pl>e?s)?\b"
)
_CELL_RE = re.compile(rf"\b(?:in|at|on)\s+the\s+(?P<cell>{_CELL})\b")
_TOTAL_RE = re.compile(rf"\b(?P<n>{_COUNT})\s+shapes?\b")
_WORD_RE = re.compile(r"\bword\s+[\"“']([^\"”']+)[\"”']|text\s+[\"“']([^\"”']+)[\"”']")


def _number(token: str | None, plural_form: bool) -> int | None:
    if token is None:
        return None if plural_form else 1
    return int(token) if token.isdigit() else _NUMBER[token]


def parse_prompt(prompt: str) -> list[Requirement]:
    """Split a prompt into requirements.

    Understands the ShapesWorld caption formats and free prompts such as
    ``"two red circles, a blue square in the top left and the word 'SUN'"``: each
    colour+shape mention is an ``object``; a cell phrase in the same clause makes it a
    ``position``; an explicit plural number makes it a ``count``; "N shapes" is a ``total``;
    a quoted word after "word"/"text" is a ``word``. A JSON scene spec is read as the scene.
    """
    text = prompt.strip()
    if text.startswith("{"):
        try:
            return scene_requirements(Scene.from_json(text))
        except (ValueError, KeyError, TypeError):
            pass
    reqs: list[Requirement] = []
    for m in _WORD_RE.finditer(text):
        reqs.append(Requirement("word", word=(m.group(1) or m.group(2)).strip()))
    lowered = _WORD_RE.sub(" ", text).lower()
    for clause in re.split(r"[.;,]|\band\b|\bwith\b", lowered):
        objects = list(_OBJECT_RE.finditer(clause))
        cells = list(_CELL_RE.finditer(clause))
        for m in objects:
            color, shape = m.group("color"), m.group("shape")
            reqs.append(Requirement("object", color, shape))
            n = _number(m.group("n"), bool(m.group("pl")))
            if n is not None and (m.group("pl") or (m.group("n") or "").isdigit()):
                reqs.append(Requirement("count", color, shape, count=n))
        if len(objects) == 1 and len(cells) == 1:
            o = objects[0]
            reqs.append(
                Requirement(
                    "position",
                    o.group("color"),
                    o.group("shape"),
                    _CELL_NAMES[cells[0].group("cell")],
                )
            )
        for m in _TOTAL_RE.finditer(clause):
            reqs.append(Requirement("total", count=_number(m.group("n"), True)))
    return _unique(reqs)


def check(
    reqs: list[Requirement],
    objects: list[DetectedObject],
    words: str | None,
    *,
    unclear_margin: float = UNCLEAR_MARGIN,
) -> list[RequirementResult]:
    """Check requirements against detected objects and OCR'd text (``None``: not read).
    An object of unclear shape (see ``DetectedObject.clear_shape``) is no shape at all:
    it never counts as the colour+shape a requirement names; ``unclear_margin=0`` reads
    every object as its best shape (forced choice)."""
    shapes = [o.clear_shape(unclear_margin) for o in objects]
    out = []
    for r in reqs:
        same = [
            o for o, s in zip(objects, shapes, strict=True) if o.color == r.color and s == r.shape
        ]
        unclear = sum(
            o.color == r.color and s is None for o, s in zip(objects, shapes, strict=True)
        )
        note = f" ({unclear} {r.color} of unclear shape)" if unclear else ""
        if r.kind == "object":
            ok, detail = bool(same), f"{len(same)} found{note}"
        elif r.kind == "position":
            cells = sorted({CELLS[o.cell] for o in same})
            ok, detail = any(o.cell == r.cell for o in same), f"found at {cells}{note}"
        elif r.kind == "count":
            ok, detail = len(same) == r.count, f"{len(same)} found{note}"
        elif r.kind == "total":
            ok, detail = len(objects) == r.count, f"{len(objects)} shapes found"
        else:
            read = (words or "").upper().split()
            ok = words is not None and (r.word or "").upper() in read
            detail = "not read (no OCR engine)" if words is None else f"read {read}"
        out.append(RequirementResult(r, ok, detail))
    return out


def verify(
    prompt_or_scene: str | Scene,
    image: np.ndarray,
    *,
    ocr: OcrEngine | None = None,
    max_color_distance: float = COLOR_DISTANCE,
    unclear_margin: float = UNCLEAR_MARGIN,
) -> Verification:
    """Score how well (h, w, 3) uint8 RGB ``image`` follows a prompt or scene spec.

    Word requirements need ``ocr`` (a ``krea2.curate.ocr.OcrEngine``); without one they
    fail with detail "not read", so a reward never silently skips them. An object whose
    shape is unclear (template IoU margin below ``unclear_margin``) fails every shape
    requirement; the forced-choice reads are kept in ``forced_results``.
    """
    reqs = (
        scene_requirements(prompt_or_scene)
        if isinstance(prompt_or_scene, Scene)
        else parse_prompt(prompt_or_scene)
    )
    objects = detect_objects(image, max_color_distance)
    words = None
    if ocr is not None and any(r.kind == "word" for r in reqs):
        words = ocr.read(image).text
    results = tuple(check(reqs, objects, words, unclear_margin=unclear_margin))
    forced = (
        tuple(check(reqs, objects, words, unclear_margin=0.0)) if unclear_margin > 0 else results
    )
    return Verification(results, tuple(objects), forced, unclear_margin)
