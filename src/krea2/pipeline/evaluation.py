"""Demo stages 6 and 7: sample held-out prompts with fixed seeds and score them (ShapesEval)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from krea2.curate.shapes import Concept, WorldSplit, concept_scene, eval_prompt, split_concepts
from krea2.curate.shapes import content_prompt as scene_content_prompt

if TYPE_CHECKING:
    from krea2.pipeline.config import DemoConfig


def content_prompt(concept: Concept) -> str:
    """The concept's medium caption without its background clause ("A red circle in the
    top left."): a prompt that names the content and leaves the style to the model (the
    domain SFTs' style prompts, RL's ``[rl_prompts]``)."""
    return scene_content_prompt(concept_scene(concept))


def demo_concepts(cfg: DemoConfig) -> tuple[WorldSplit, list[Concept]]:
    """The demo's concept split (``split.train``: the pool renders them and the preference
    stage's pairs prompt them) and the held-out concepts it evaluates (the first
    ``eval.max_prompts`` of ``split.held_out``)."""
    split = split_concepts(cfg.pool.seed, cfg.pool.held_out_fraction)
    return split, list(split.held_out[: cfg.eval.max_prompts])


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
        # the forced-choice verifier's numbers (before the unclear verdict), for one release
        "shapes_eval_forced": result.score_forced,
        "all_correct_forced": result.all_correct_forced,
        "unclear_rate": result.unclear_rate,
        "per_image": result.per_image,
        "prompts": [eval_prompt(c) for c in concepts],
    }


def paired_delta(scores: Any, base: Any) -> dict[str, float]:
    """Mean of per-image scores [prompts][seeds] minus ``base``'s on the same prompts and
    seeds, and its standard error over the prompts (a prompt's seeds averaged first: they
    share its difficulty). Pairing removes the prompts' spread, most of an unpaired
    difference's noise."""
    diff = np.asarray(scores, np.float64).mean(1) - np.asarray(base, np.float64).mean(1)
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
    return {"delta": float(diff.mean()), "se": se}
