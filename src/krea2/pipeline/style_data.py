"""ShapesWorld data of the style stage: training shards and the held-out evaluation cases.

Training rows are one-object scenes of the *training* concepts drawn in random styles
(:func:`krea2.curate.shapes.sample_style`), captioned by their content alone
(:func:`~krea2.curate.shapes.content_prompt`: no word of background or object style, so
the style must come from the reference; and the ``short`` caption, colour and shape without
the position, as real captions leave things out), each with a ``reference`` column: another scene
in the same style (the oracle variant's reference; the other variants make theirs from
the image itself). Style labels ride in ``meta`` for measurement only; the module never
sees them.

Evaluation cases pair a held-out concept's prompt with a reference of a style drawn from
another seed, whose one or two objects have colours and shapes the prompt does not name,
so any of them in an output is leakage.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from krea2.curate.shapes import (
    Scene,
    ShapeObject,
    StyleSpec,
    apply_style,
    captions,
    concept_scene,
    content_prompt,
    render,
    sample_style,
)

Concept = tuple[str, str, int]


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _scene(rng: np.random.Generator, concept: Concept) -> Scene:
    """``concept``'s one-object scene, large or medium, jittered."""
    size = str(rng.choice(["large", "medium"]))
    jitter = (float(rng.uniform(-1, 1)), float(rng.uniform(-1, 1)))
    return concept_scene(concept, size=size, jitter=jitter)


def _other_content(rng: np.random.Generator, avoid: Concept, pool: list[Concept]) -> Scene:
    """One or two objects of ``pool`` concepts whose colour and shape both differ from
    ``avoid``'s, in distinct cells other than ``avoid``'s."""
    colour, shape, cell = avoid
    choices = [c for c in pool if c[0] != colour and c[1] != shape and c[2] != cell]
    objects: list[ShapeObject] = []
    for i in rng.permutation(len(choices)):
        c = choices[int(i)]
        if any(o.cell == c[2] or (o.color, o.shape) == c[:2] for o in objects):
            continue
        objects.append(ShapeObject(c[1], c[0], c[2], str(rng.choice(["large", "medium"]))))
        if len(objects) == 1 + int(rng.integers(2)):
            break
    return Scene(tuple(objects))


def write_style_shards(
    out: Path,
    concepts: list[Concept],
    n: int,
    side: int,
    seed: int,
    batch_size: int,
    object_styles: tuple[str, ...] = ("filled",),
    uncaptioned: float = 0.0,
) -> Path:
    """``n`` training rows at ``side`` px (module docstring) into ``out/shard-000.parquet``
    (published whole: a crash leaves no shard). With probability ``uncaptioned`` a row's
    scene also holds one object its captions do not name (another concept's colour and
    shape in another cell), as real captions leave objects out: a module that reconstructs
    its reference learns to carry that object over, which is content leakage. Returns
    ``out``."""
    from krea2.infra import write_shard
    from krea2.infra.atomic import publish_dir

    rng = np.random.default_rng(seed)
    extra_rng = np.random.default_rng([seed, 3])  # its own stream: 0 leaves the rows as before
    rows = []
    for i in range(n):
        concept = concepts[int(rng.integers(len(concepts)))]
        style = sample_style(rng, object_styles=object_styles)
        scene = named = apply_style(_scene(rng, concept), style)  # what the captions name
        other = apply_style(_other_content(rng, concept, concepts), style)
        if uncaptioned > 0 and extra_rng.random() < uncaptioned:
            extra = _other_content(extra_rng, concept, concepts).objects[:1]
            scene = replace(named, objects=named.objects + extra)
        rows.append(
            {
                "key": f"style-{seed}-{i:06d}",
                "image": _png(render(scene, side, side)),
                "uri": None,
                "crop": None,
                "width": side,
                "height": side,
                "bucket": f"{side}x{side}",
                "captions": [
                    {"format": "medium", "text": content_prompt(named)},
                    {"format": "short", "text": captions(named)["short"]},
                ],
                "meta": json.dumps({"scene": scene.to_dict()}),
                "reference": _png(render(other, side, side)),
            }
        )

    def write(tmp: Path) -> None:
        write_shard(rows, tmp / "shard-000.parquet", stage=f"style{side}", seed=seed,
                    batch_size=batch_size)  # fmt: skip

    publish_dir(out, write)
    return out


@dataclass(frozen=True)
class StyleCase:
    """One held-out evaluation case: ``prompt`` (content only) asking for ``target``;
    ``reference`` (a scene of other content) drawn in ``style``."""

    prompt: str
    target: Scene
    reference: Scene
    style: StyleSpec

    def reference_pixels(self, side: int) -> np.ndarray:
        """uint8 [side, side, 3]."""
        return render(self.reference, side, side)


def style_cases(
    held_out: list[Concept],
    pool: list[Concept],
    n: int,
    seed: int,
    object_styles: tuple[str, ...] = ("filled",),
) -> list[StyleCase]:
    """``n`` cases: held-out concepts in turn, each with a reference of a fresh style (drawn
    from ``seed``, which the training shards' seed must differ from) showing ``pool``
    concepts of other colours and shapes."""
    rng = np.random.default_rng([seed, 7])
    cases = []
    for i in range(n):
        concept = held_out[i % len(held_out)]
        style = sample_style(rng, object_styles=object_styles)
        target = concept_scene(concept)
        reference = apply_style(_other_content(rng, concept, pool), style)
        cases.append(StyleCase(content_prompt(target), target, reference, style))
    return cases


__all__ = ["StyleCase", "style_cases", "write_style_shards"]
