"""On-policy preference pairs: the current model samples N images per prompt with fixed
seeds, a reward ranks them, and the best and worst of each prompt become a pair."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from krea2.infra.errors import UserError
from krea2.infra.progress import progress
from krea2.rl.preference.shards import Pair
from krea2.rl.rewards import Reward
from krea2.trainer import JobConfig, sample_stage


def rank_pairs(
    prompts: Sequence[str],
    scores: np.ndarray,
    uris: Sequence[Sequence[str]],
    seeds: Sequence[int],
    model_step: int | None,
    sub_scores: dict[str, np.ndarray] | None = None,
    min_gap: float = 0.0,
) -> list[Pair]:
    """One pair per prompt from ``scores`` [P, N] (reward of sample n of prompt p, drawn
    with ``seeds[n]``; its PNG at ``uris[p][n]``): the best-scored sample wins, the worst
    loses. Prompts whose best and worst differ by less than ``min_gap`` (or not at all)
    give no pair: a tie teaches nothing."""
    pairs = []
    for p, prompt in enumerate(prompts):
        row = scores[p]
        w, lo = int(np.argmax(row)), int(np.argmin(row))
        gap = float(row[w] - row[lo])
        if gap <= 0 or gap < min_gap:
            continue
        subs = {k: [float(v[p, w]), float(v[p, lo])] for k, v in (sub_scores or {}).items()}
        key = hashlib.sha1(f"{prompt}|{seeds[w]}|{seeds[lo]}|{model_step}".encode()).hexdigest()
        pairs.append(
            Pair(
                pair_id=key[:16],
                prompt=prompt,
                winner_uri=uris[p][w],
                loser_uri=uris[p][lo],
                source="on-policy",
                model_step=model_step,
                winner_seed=int(seeds[w]),
                loser_seed=int(seeds[lo]),
                scores={"winner": float(row[w]), "loser": float(row[lo]), "sub": subs},
            )
        )
    return pairs


def generate_pairs(
    job: JobConfig,
    stage_index: int,
    prompts: Sequence[str],
    reward: Reward,
    out: Path,
    samples_per_prompt: int = 4,
    seed: int = 0,
    steps: int = 20,
    cfg_scale: float = 2.0,
    min_gap: float = 0.0,
    batch_prompts: int = 16,
) -> list[Pair]:
    """Sample ``samples_per_prompt`` images per prompt from the newest checkpoint of
    ``job.stages[stage_index]`` (seeds ``seed .. seed + N - 1``, Euler ``steps``, CFG
    ``cfg_scale``), save them as PNGs under ``out``, score them with ``reward`` and rank
    them into pairs (:func:`rank_pairs`). The pairs' ``model_step`` is the stage's last."""
    from PIL import Image

    if samples_per_prompt < 2:
        raise UserError(f"samples_per_prompt={samples_per_prompt}: a pair needs at least 2")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(seed, seed + samples_per_prompt))
    model_step = job.stages[stage_index].steps - 1
    pairs: list[Pair] = []
    with progress("on-policy pairs", len(prompts), unit="prompt") as bar:
        for start in range(0, len(prompts), batch_prompts):
            chunk = list(prompts[start : start + batch_prompts])
            images = sample_stage(job, stage_index, chunk, seeds, steps, cfg_scale)
            flat = images.reshape(-1, *images.shape[2:])
            scored = reward(flat, [p for p in chunk for _ in seeds])
            uris = []
            for p in range(len(chunk)):
                row = []
                for n, s in enumerate(seeds):
                    path = out / f"{model_step}-{start + p:05d}-{s}.png"
                    Image.fromarray(images[p, n]).save(path)
                    row.append(f"file://{path}")
                uris.append(row)
            shape = (len(chunk), len(seeds))
            subs = {k: np.asarray(v).reshape(shape) for k, v in scored.sub_scores.items()}
            scores = np.asarray(scored.scores).reshape(shape)
            pairs += rank_pairs(chunk, scores, uris, seeds, model_step, subs, min_gap)
            bar.update(start + len(chunk))
    return pairs
