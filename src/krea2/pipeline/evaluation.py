"""Demo stages 6 and 7: sample held-out prompts with fixed seeds and score them (ShapesEval)."""

from __future__ import annotations

import numpy as np

from krea2.pipeline.world import Concept, concept_scene, eval_prompt


def sample(
    job,
    stage_index: int,
    trained: bool,
    prompts: list[str],
    seeds: list[int],
    steps: int,
    cfg_scale: float,
) -> np.ndarray:
    """uint8 images [len(prompts), len(seeds), H, W, 3] at the stage's resolution, from its
    final checkpoint or (``trained=False``) the untrained initialization."""
    from krea2.trainer.inference import sample_stage

    return sample_stage(job, stage_index, prompts, seeds, steps, cfg_scale, trained=trained)


def shapes_eval(images: np.ndarray, concepts: list[Concept]) -> dict:
    """Rubric-verifier scores of images [P, S, H, W, 3] for their concepts: the mean score
    (ShapesEval) and the mean pass rate per requirement kind."""
    from krea2.curate.shapes import verify

    scores: list[float] = []
    kinds: dict[str, list[float]] = {}
    per_image: list[list[float]] = []
    for concept, row in zip(concepts, images, strict=True):
        scene = concept_scene(concept)
        per_image.append([])
        for image in row:
            v = verify(scene, image)
            scores.append(v.score)
            per_image[-1].append(v.score)
            for kind, value in v.by_kind().items():
                kinds.setdefault(kind, []).append(value)
    return {
        "shapes_eval": float(np.mean(scores)),
        "by_kind": {k: float(np.mean(v)) for k, v in sorted(kinds.items())},
        "all_correct": float(np.mean([s == 1.0 for s in scores])),
        "per_image": per_image,
        "prompts": [eval_prompt(c) for c in concepts],
    }
