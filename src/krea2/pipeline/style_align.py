"""Preference alignment of the style module (the report's step after self-supervised
training): STPO on the module's parameters alone, from variant S.

S samples ``samples`` images for each of ``cases`` training cases (a training concept's
content prompt with a reference of a fresh style, drawn from the recipe's ``seed``); each
image is scored by style similarity to its reference minus leakage (1 when it shows an
object of the reference), the style similarity weighing the rule-based one (background kind
and colour) and the toy CSD's cosine by ``csd_weight``, with ShapesEval held: a pair's
winner has the case's best content score, its loser a content score no better, and the
winner leads by at least ``min_gap`` of reward. The pairs (with the reference both images
were sampled with, the shards' ``reference`` column) train stage ``style-po`` after S's
stage in S's own run: the trainer's ``stpo`` objective with ``style_from`` (only the module
trains, the base stays raw; the frozen reference policy is S). Everything is kept under
``work``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from krea2.trainer import JobConfig

ALIGNED = "style-po"  # the stage's name in S's run


def pair_reward(measures: dict, csd_weight: float = 0.0) -> np.ndarray:
    """Style similarity − leaked per image [P, S]: what a pair's winner leads by. The style
    similarity is (1 − ``csd_weight``) x ``similarity`` + ``csd_weight`` x ``csd`` (the toy
    CSD's cosine; read only when ``csd_weight`` > 0)."""
    style = np.asarray(measures["similarity"], np.float64)
    if csd_weight > 0:
        style = (1 - csd_weight) * style + csd_weight * np.asarray(measures["csd"], np.float64)
    return style - np.asarray(measures["leaked"])


def candidate_pairs(measures: dict, min_gap: float,
                    csd_weight: float = 0.0) -> list[tuple[int, int, int]]:  # fmt: skip
    """(case, winner sample, loser sample) per case from per-image measures [P][S]
    (``similarity``, ``leaked``, ``content``, and ``csd`` when ``csd_weight`` > 0): the
    winner the best reward (:func:`pair_reward`) among the samples of the case's best
    content, the loser the worst reward among samples of no better content; none when the
    gap is under ``min_gap``."""
    reward = pair_reward(measures, csd_weight)
    content = np.asarray(measures["content"], np.float64)
    pairs = []
    for p in range(reward.shape[0]):
        best = np.flatnonzero(content[p] >= content[p].max() - 1e-9)
        w = int(best[np.argmax(reward[p, best])])
        held = np.flatnonzero(content[p] <= content[p, w] + 1e-9)
        held = held[held != w]
        if not len(held):
            continue
        loser = int(held[np.argmin(reward[p, held])])
        if reward[p, w] - reward[p, loser] >= min_gap:
            pairs.append((p, w, loser))
    return pairs


def write_pairs(images: np.ndarray, references: np.ndarray, cases: list, chosen: list,
                seeds: list[int], out: Path, pairs_per_batch: int) -> Path:  # fmt: skip
    """PNGs of the chosen pairs' images and references under ``out`` and their pair shards
    (:func:`krea2.rl.preference.export_pair_shards`) under ``out/shards``."""
    from PIL import Image

    from krea2.rl.preference import Pair, export_pair_shards

    png = out / "png"
    png.mkdir(parents=True, exist_ok=True)
    pairs = []
    for p, w, loser in chosen:
        paths = {}
        for role, im in (("w", images[p, w]), ("l", images[p, loser]), ("ref", references[p])):
            paths[role] = png / f"{p:03d}-{role}.png"
            Image.fromarray(im).save(paths[role])
        pairs.append(Pair(f"case{p:03d}", cases[p].prompt, f"file://{paths['w']}",
                          f"file://{paths['l']}", winner_seed=seeds[w], loser_seed=seeds[loser],
                          reference_uri=f"file://{paths['ref']}"))  # fmt: skip
    side = images.shape[2]
    export_pair_shards(pairs, out / "shards", side, pairs_per_batch=pairs_per_batch)
    return out / "shards"


def aligned_job(style: tuple[JobConfig, int], shards: Path, a: Any) -> JobConfig:
    """S's job with stage ``style-po`` after its style stage: STPO (``a.preference``) on
    the module alone (``style_from``) for ``a.steps`` steps of ``a.batch_size`` images."""
    from krea2.infra import config_to_dict
    from krea2.trainer import ScheduleConfig

    job, index = style
    stage = replace(
        job.stages[index], name=ALIGNED, objective=str(a.preference.kind),
        settings=config_to_dict(a.preference), style_from=job.stages[index].name,
        data=[f"{shards}/*.parquet"], steps=a.steps, batch_size=a.batch_size, lr=a.lr,
        caption_weights={"medium": 1.0}, caption_dropout=0.0, spike_guard=False,
        schedule=ScheduleConfig(warmup_steps=min(5, a.steps - 1), decay_ratio=0.0),
    )  # fmt: skip
    return replace(job, stages=[*job.stages[: index + 1], stage])


def align_style(a: Any, style: tuple[JobConfig, int], work: Path, cases: list, csd: Any,
                steps: int, measure: Any, sampler_of: Any) -> dict:  # fmt: skip
    """Sample S on ``cases``, rank the pairs, train ``style-po``; returns ``model`` (job,
    stage index), ``pairs`` (how many), ``candidates`` (the candidates' mean measures)
    and ``reward_gap`` (mean winner − loser reward). ``measure(images, cases, csd)`` gives
    per-image measures; ``sampler_of(model, seeds, steps)`` a sampler (style_stage's);
    the candidates take ``a.sample_steps`` Euler steps, or ``steps`` where it is 0."""
    from krea2.trainer import encode_images, train_style

    work.mkdir(parents=True, exist_ok=True)
    job, index = style
    side = job.stages[index].resolution
    seeds = list(range(a.seed, a.seed + a.samples))
    references = np.stack([c.reference_pixels(side) for c in cases])
    refs = encode_images(job, references)[:, None]
    images = sampler_of(style, seeds, a.sample_steps or steps)(
        work / "candidates.npy", [c.prompt for c in cases], refs, [[1.0]] * len(cases)
    )
    m = measure(images, cases, csd)
    chosen = candidate_pairs(m, a.min_gap, a.csd_weight)
    if len(chosen) * 2 < a.batch_size:
        raise ValueError(
            f"style alignment: {len(chosen)} pairs from {len(cases)} cases, fewer than one "
            f"batch of {a.batch_size} images; give more cases or samples"
        )
    shards = write_pairs(images, references, cases, chosen, seeds, work, a.batch_size // 2)
    aligned = aligned_job(style, shards, a)
    train_style(job, index, aligned)
    reward = pair_reward(m, a.csd_weight)
    gap = [reward[p, w] - reward[p, loser] for p, w, loser in chosen]
    return {
        "model": (aligned, len(aligned.stages) - 1),
        "pairs": len(chosen),
        "candidates": {k: float(np.mean(v)) for k, v in m.items()},
        "reward_gap": float(np.mean(gap)),
    }
