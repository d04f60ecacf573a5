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
    pairs_per_prompt: int = 1,
) -> list[Pair]:
    """Up to ``pairs_per_prompt`` pairs per prompt from ``scores`` [P, N] (reward of sample
    n of prompt p, drawn with ``seeds[n]``; its PNG at ``uris[p][n]``): the k-th best sample
    against the k-th worst (k = 1: best vs worst), each sample in at most one pair, so
    ``pairs_per_prompt`` is at most N // 2. Pairs whose scores differ by less than
    ``min_gap`` (or not at all) are left out: a tie teaches nothing."""
    if not 1 <= pairs_per_prompt <= max(1, scores.shape[1] // 2):
        raise UserError(
            f"pairs_per_prompt={pairs_per_prompt} must be in 1..{scores.shape[1] // 2} "
            f"for {scores.shape[1]} samples per prompt (each sample in one pair at most)"
        )
    pairs = []
    for p, prompt in enumerate(prompts):
        row = scores[p]
        order = np.argsort(-row, kind="stable")
        for k in range(pairs_per_prompt):
            w, lo = int(order[k]), int(order[len(order) - 1 - k])
            pair = _pair(prompt, row, w, lo, uris[p], seeds, model_step, sub_scores, p, min_gap)
            if pair is not None:
                pairs.append(pair)
    return pairs


def _pair(
    prompt: str,
    row: np.ndarray,
    w: int,
    lo: int,
    uris: Sequence[str],
    seeds: Sequence[int],
    model_step: int | None,
    sub_scores: dict[str, np.ndarray] | None,
    p: int,
    min_gap: float,
) -> Pair | None:
    gap = float(row[w] - row[lo])
    if gap <= 0 or gap < min_gap:
        return None
    subs = {k: [float(v[p, w]), float(v[p, lo])] for k, v in (sub_scores or {}).items()}
    key = hashlib.sha1(f"{prompt}|{seeds[w]}|{seeds[lo]}|{model_step}".encode()).hexdigest()
    return Pair(
        pair_id=key[:16],
        prompt=prompt,
        winner_uri=uris[w],
        loser_uri=uris[lo],
        source="on-policy",
        model_step=model_step,
        winner_seed=int(seeds[w]),
        loser_seed=int(seeds[lo]),
        scores={"winner": float(row[w]), "loser": float(row[lo]), "sub": subs},
    )


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
    pairs_per_prompt: int = 1,
) -> list[Pair]:
    """Sample ``samples_per_prompt`` images per prompt from the newest checkpoint of
    ``job.stages[stage_index]`` (seeds ``seed .. seed + N - 1``, Euler ``steps``, CFG
    ``cfg_scale``), save them as PNGs under ``out``, score them with ``reward`` and rank
    them into ``pairs_per_prompt`` pairs per prompt (:func:`rank_pairs`). The pairs'
    ``model_step`` is the stage's last."""
    from PIL import Image

    if samples_per_prompt < 2:
        raise UserError(f"samples_per_prompt={samples_per_prompt}: a pair needs at least 2")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(seed, seed + samples_per_prompt))
    model_step = job.stages[stage_index].steps - 1
    pairs: list[Pair] = []
    # Progress counts Euler steps: a chunk of prompts is one sampling call that can take
    # minutes, so a per-prompt count would sit still until the whole chunk is done.
    chunks = -(-len(prompts) // batch_prompts)
    with progress("on-policy samples", chunks * steps * len(seeds), unit="step") as bar:
        for start in range(0, len(prompts), batch_prompts):
            chunk = list(prompts[start : start + batch_prompts])
            images = sample_stage(
                job, stage_index, chunk, seeds, steps, cfg_scale, on_step=bar.advance
            )
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
            pairs += rank_pairs(
                chunk, scores, uris, seeds, model_step, subs, min_gap, pairs_per_prompt
            )
    return pairs
