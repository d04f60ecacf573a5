"""Demo stages 6 and 7: sample held-out prompts with fixed seeds and score them (ShapesEval)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from krea2.pipeline.world import Concept, concept_scene, eval_prompt


def load_module(job, stage_index: int, trained: bool):
    """The trainer's module for a stage: its final checkpoint, or the untrained (seeded)
    initialization that the first stage started from."""
    import torch.distributed.checkpoint.state_dict as sd

    from krea2.infra.checkpoint import CheckpointManager
    from krea2.trainer.build import build_module
    from krea2.trainer.distributed import init_distributed

    stage = job.stages[stage_index]
    module = build_module(job, stage, init_distributed(job))
    if trained:
        state = {"model": sd.get_model_state_dict(module)}
        CheckpointManager(Path(job.run_dir) / "checkpoints" / stage.name).load(state)
        sd.set_model_state_dict(module, state["model"])
    return module.eval()


def sample(
    job,
    stage_index: int,
    trained: bool,
    prompts: list[str],
    seeds: list[int],
    steps: int,
    cfg_scale: float,
) -> np.ndarray:
    """uint8 images [len(prompts), len(seeds), H, W, 3] at the stage's resolution."""
    from krea2.dit import flow
    from krea2.trainer.build import build_autoencoder, dit_config
    from krea2.trainer.evaluate import sample_grid

    stage = job.stages[stage_index]
    module = load_module(job, stage_index, trained)
    ae = build_autoencoder(
        job.model.autoencoder, job.model.ae_factor, next(module.parameters()).device
    )
    side = stage.resolution
    factor = job.model.ae_factor * dit_config(job).patch
    tokens = (side // factor) ** 2
    mu = stage.time_shift if stage.time_shift is not None else flow.resolution_mu(tokens)
    return sample_grid(module, ae, prompts, seeds, (side, side), steps, cfg_scale, mu)


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
