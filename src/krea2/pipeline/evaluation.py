"""Demo stages 6 and 7: sample held-out prompts with fixed seeds and score them (ShapesEval)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from krea2.curate.shapes import Concept, concept_scene, eval_prompt


def sample(
    job,
    stage_index: int,
    trained: bool,
    prompts: list[str],
    seeds: list[int],
    steps: int,
    cfg_scale: float,
    on_step: Callable[[], None] | None = None,
) -> np.ndarray:
    """uint8 images [len(prompts), len(seeds), H, W, 3] at the stage's resolution, from its
    final checkpoint or (``trained=False``) the untrained initialization; ``on_step()``
    follows each of the ``steps * len(seeds)`` Euler steps."""
    from krea2.trainer import sample_stage

    return sample_stage(
        job, stage_index, prompts, seeds, steps, cfg_scale, trained=trained, on_step=on_step
    )


def shapes_eval(images: np.ndarray, concepts: list[Concept]) -> dict:
    """ShapesEval (``krea2.curate.shapes.shapes_eval``) of images [P, S, H, W, 3] for their
    concepts' scenes: the mean score and the mean pass rate per requirement kind."""
    from krea2.curate.shapes import shapes_eval as score

    result = score(images, [concept_scene(c) for c in concepts])
    return {
        "shapes_eval": result.score,
        "by_kind": result.by_kind,
        "all_correct": result.all_correct,
        "per_image": result.per_image,
        "prompts": [eval_prompt(c) for c in concepts],
    }
