"""The expander stage of a krea2 run: SFT, then GDPO with and without the diversity reward,
each measured in front of a trained DiT stage on held-out short user requests.

What is measured (`evaluate_expander`), per expander:

- faithfulness: the share of held-out requests whose greedy expansion keeps every stated
  requirement and contradicts none (`check_faithfulness`);
- ShapesEval on the user's request: the DiT renders the raw request and the expansion
  (same seeds, same sampling), and the rubric verifier scores both images against the
  **request's** requirements: what the expander adds must not cost what the user asked;
- intra-group diversity: ``group`` sampled expansions per request, rendered from one seed,
  mean pairwise cosine distance of an image embedding within each request's group (the
  quantity the diversity reward trains; report §8 says it collapses without it).

Every step saves its output under ``work`` and is skipped when run again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from krea2.curate.shapes import Scene
from krea2.expander.faithfulness import check_faithfulness
from krea2.expander.gdpo import GdpoConfig, run_gdpo
from krea2.expander.rewards import ExpanderRewards, group_diversity, pixel_embedding
from krea2.expander.sft import SftConfig, generate, run_sft
from krea2.expander.sft_data import shapes_sft_examples, split_answer
from krea2.expander.stage_settings import ExpanderStageSettings
from krea2.expander.toy_model import load_model
from krea2.expander.user_prompts import UserPrompt, UserPromptConfig, user_prompt

__all__ = ["evaluate_expander", "expander_pipeline", "run_expander_stage", "scene_requests"]

Sampler = Callable[[list[str], list[int]], np.ndarray]  # prompts, seeds -> [P, S, H, W, 3]
Renderer = Callable[[list[str]], np.ndarray]  # prompts -> [P, H, W, 3], one fixed seed


def scene_requests(
    scenes: Sequence[Scene], per_scene: int, seed: int, target: str
) -> list[UserPrompt]:
    """``per_scene`` synthetic requests per scene, one fixed draw (`UserPrompt` each)."""
    rng = np.random.default_rng(seed)
    cfg = UserPromptConfig(target=target)
    return [user_prompt(s, rng, cfg) for s in scenes for _ in range(per_scene)]


def _rubric() -> Any:
    from krea2.rl.rewards import ShapesRubricReward

    return ShapesRubricReward()


def _score(images: np.ndarray, requests: list[str]) -> dict:
    """Rubric scores of images [P, S, H, W, 3] against each row's request."""
    p, s = images.shape[:2]
    flat = images.reshape(p * s, *images.shape[2:])
    scores = _rubric()(flat, [r for r in requests for _ in range(s)]).scores.reshape(p, s)
    return {
        "shapes_eval": float(scores.mean()),
        "all_correct": float((scores >= 1.0 - 1e-6).mean()),
        "per_request": scores.mean(axis=1).round(4).tolist(),
    }


def evaluate_expander(
    model: Any,
    tokenizer: Any,
    requests: Sequence[UserPrompt],
    sample: Sampler,
    seeds: list[int],
    group: int,
    max_new_tokens: int,
    temperature: float = 1.0,
) -> dict:
    """Faithfulness, ShapesEval on the requests through the expander and intra-group
    diversity (see the module's docstring) of one expander; the images are returned
    under ``images`` (expanded, [P, S, H, W, 3] uint8) and ``group_images``."""
    import torch

    texts = [r.text for r in requests]
    torch.manual_seed(0)
    answers = generate(model, tokenizer, texts, max_new_tokens=max_new_tokens)
    expansions = [split_answer(a)[1] for a in answers]
    verdicts = [check_faithfulness(r, e) for r, e in zip(texts, expansions, strict=True)]
    images = sample([e or r for e, r in zip(expansions, texts, strict=True)], seeds)
    out = {
        "faithful": float(np.mean([v.faithful for v in verdicts])),
        "faithfulness_score": float(np.mean([v.score for v in verdicts])),
        **_score(images, texts),
        "expansions": expansions,
    }
    torch.manual_seed(1)
    repeated = [t for t in texts for _ in range(group)]
    # Sampling (any sampling argument turns it on), as GDPO's rollouts sample.
    sampled = generate(
        model, tokenizer, repeated, max_new_tokens=max_new_tokens, temperature=temperature
    )
    sampled = [split_answer(a)[1] for a in sampled]
    group_images = sample([e or r for e, r in zip(sampled, repeated, strict=True)], seeds[:1])[:, 0]
    diversity = group_diversity(pixel_embedding(group_images), group)
    distinct = [len(set(sampled[i : i + group])) / group for i in range(0, len(sampled), group)]
    out.update(
        diversity=float(diversity.mean()),
        distinct_expansions=float(np.mean(distinct)),
        images=images,
        group_images=group_images,
    )
    return out


def _cached(path: Path, make: Callable[[], dict]) -> dict:
    """``make()``'s result saved as JSON at ``path``, each of its arrays as a .npy file
    beside it (the result holds that file's path instead); loaded when already there."""
    if path.is_file():
        return dict(json.loads(path.read_text()))
    result = make()
    for key, value in list(result.items()):
        if isinstance(value, np.ndarray):
            array = path.with_name(f"{path.stem}.{key}.npy")
            np.save(array, value)
            result[key] = str(array)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return result


def _curves(history: list[dict]) -> dict[str, list]:
    """Per logged GDPO step: the mean of each reward and the gate rate (trl's keys)."""
    rows = [h for h in history if any(k.startswith("rewards/") for k in h)]
    names = sorted({k.split("/")[1] for h in rows for k in h if k.startswith("rewards/")})
    curves: dict[str, list] = {"step": [h.get("step") for h in rows]}
    for n in names:
        curves[n] = [h.get(f"rewards/{n}/mean") for h in rows]
    return curves


def run_expander_stage(
    job: Any,
    stage_index: int,
    work: Path,
    train_scenes: Sequence[Scene],
    held_out_scenes: Sequence[Scene],
    settings: ExpanderStageSettings,
) -> dict:
    """`expander_pipeline` in front of ``job``'s trained stage ``stage_index``: held-out
    images sampled as ShapesEval (``eval_*``), GDPO rollouts rendered by `StageRenderer`."""
    from krea2.expander.rewards import StageRenderer
    from krea2.trainer import load_stage_module, sample_module

    s = settings
    module = load_stage_module(job, stage_index, True, None)

    def sample(prompts: list[str], seeds: list[int]) -> np.ndarray:
        return sample_module(job, stage_index, module, prompts, seeds, s.eval_steps, s.eval_cfg)

    def renderer() -> Renderer:
        return StageRenderer(job, stage_index, s.render_steps, s.render_cfg, s.seed)

    def image_rewards() -> dict[str, Any]:
        """The rubric, and (``artifact_weight`` > 0) the artifact reward with its head
        calibrated on the DiT's renders of training requests (saved under ``work``)."""
        rewards: dict[str, Any] = {"rubric": _rubric()}
        if s.artifact_weight > 0:
            from krea2.rl.online import shapes_rewards

            scenes = list(train_scenes)[:64]
            prompts = [r.text for r in scene_requests(scenes, 1, s.seed, s.target)]
            calibrate = lambda: renderer()(prompts)  # noqa: E731
            rewards["artifact"] = shapes_rewards(work / "rewards", calibrate)["artifact"]
        return rewards

    return expander_pipeline(
        work, train_scenes, held_out_scenes, s, sample, renderer, image_rewards
    )


def expander_pipeline(
    work: Path,
    train_scenes: Sequence[Scene],
    held_out_scenes: Sequence[Scene],
    settings: ExpanderStageSettings,
    sample: Sampler,
    renderer: Callable[[], Renderer],
    image_rewards: Callable[[], dict[str, Any]] | None = None,
) -> dict:
    """SFT an expander on ``train_scenes``' requests, GDPO it with rollouts drawn by
    ``renderer()`` and scored by ``image_rewards()`` (name -> `krea2.rl.rewards` reward;
    the rubric alone by default) (with and, if asked, without the diversity reward), and
    measure each
    expander and the raw requests on ``held_out_scenes`` with ``sample``. Each step's
    output is saved under ``work`` after it finishes and is not redone."""
    s = settings
    start = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    upc = UserPromptConfig(target=s.target)
    scenes = list(train_scenes)[: s.max_scenes]
    if not scenes:
        raise ValueError("no training scenes: the expander's SFT data is written from them")
    examples = [
        e
        for k in range(s.requests_per_scene)
        for e in shapes_sft_examples(scenes, seed=s.seed + k, config=upc)
    ]
    sft_dir = work / "sft"
    if not (work / "sft.json").is_file():  # written after the model: a killed run redoes it
        sft_cfg = SftConfig(toy=s.toy, steps=s.sft_steps, batch_size=s.sft_batch, lr=s.sft_lr,
                            seed=s.seed, max_length=256)  # fmt: skip
        sft = run_sft(examples, sft_dir, sft_cfg)
        (work / "sft.json").write_text(json.dumps(sft))
    sft_losses = json.loads((work / "sft.json").read_text())["losses"]

    requests = scene_requests(held_out_scenes, s.requests_per_concept, s.seed + 1000, s.target)
    texts = [r.text for r in requests]
    raw = _cached(work / "eval-raw.json", lambda: {**_score(im := sample(texts, s.eval_seeds),
                                                              texts), "images": im})  # fmt: skip

    def measure(name: str, folder: Path) -> dict:
        def run() -> dict:
            model, tok = load_model(folder)
            model.eval()
            return evaluate_expander(model, tok, requests, sample, s.eval_seeds, s.group,
                                     s.max_new_tokens, s.temperature)  # fmt: skip

        return _cached(work / f"eval-{name}.json", run)

    models = {"sft": measure("sft", sft_dir)}
    curves: dict[str, dict] = {}
    runs = [("gdpo", s.diversity_weight)] + [("gdpo-no-diversity", 0.0)] * s.ablate_diversity
    train_requests = [
        r.text
        for r in scene_requests(scenes, 1, s.seed + 2000, s.target)
        if r.kept  # a request the verifier cannot read gives GDPO nothing to compare
    ]
    for name, weight in runs if s.gdpo_steps else []:
        folder = work / name
        if not (work / f"{name}.json").is_file():
            model, tok = load_model(sft_dir)
            scored = image_rewards() if image_rewards else {"rubric": _rubric()}
            rewards = ExpanderRewards(renderer(), scored, s.group)
            weights = {"diversity": weight}
            if "artifact" in scored:
                weights["artifact"] = s.artifact_weight
            cfg = GdpoConfig(steps=s.gdpo_steps, prompts_per_step=s.gdpo_prompts,
                             num_generations=s.group, lr=s.gdpo_lr, temperature=s.temperature,
                             max_completion_length=s.max_new_tokens,
                             weights=weights, seed=s.seed, log_every=1)  # fmt: skip
            result = run_gdpo(model, tok, train_requests, rewards, folder, cfg)
            (work / f"{name}.json").write_text(json.dumps(_curves(result["history"])))
        curves[name] = json.loads((work / f"{name}.json").read_text())
        models[name] = measure(name, folder)
    return {
        "settings": asdict(s),
        "sft_examples": len(examples),
        "sft_losses": sft_losses,
        "requests": texts,
        "kept": [[q.describe() for q in r.kept] for r in requests],
        "raw": raw,
        "models": models,
        "curves": curves,
        "work": str(work),
        "seconds": time.perf_counter() - start,
    }
