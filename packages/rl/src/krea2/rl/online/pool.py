"""Prompt-pool curation from reward statistics: keep the prompts RL can learn from.

A prompt teaches nothing when every image of its group already earns the top reward
(always solved), when none earns anything (never solved), or when its group's rewards do
not differ (no variance: GRPO's advantage is 0 for every image). :func:`curate_pool`
drops those and records why, per prompt; :func:`pool_statistics` measures the groups by
sampling the model without CFG, as the rollouts do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

KEEP = "kept"
SOLVED = "always solved"
UNSOLVED = "never solved"
FLAT = "no reward variance"


@dataclass(frozen=True)
class PromptRecord:
    """One prompt's group statistics and the verdict: ``reason`` is ``kept`` or why it was
    dropped (:data:`SOLVED`, :data:`UNSOLVED`, :data:`FLAT`)."""

    prompt: str
    reason: str
    mean: float
    min: float
    max: float
    std: float

    @property
    def kept(self) -> bool:
        return self.reason == KEEP


def curate_pool(
    prompts: Sequence[str],
    scores: np.ndarray,
    solved_at: float = 1.0,
    never_at: float = 0.0,
    min_std: float = 1e-6,
) -> list[PromptRecord]:
    """A record per prompt from its group's rewards ``scores`` [P, G]: always solved when
    every image scores ≥ ``solved_at``, never solved when none scores > ``never_at``, no
    variance when the std is < ``min_std``; else kept (checked in that order)."""
    s = np.asarray(scores, np.float64)
    if s.ndim != 2 or s.shape[0] != len(prompts):
        raise ValueError(f"scores must be [{len(prompts)} prompts, group], got {s.shape}")
    out = []
    for prompt, row in zip(prompts, s, strict=True):
        if row.min() >= solved_at - 1e-9:
            reason = SOLVED
        elif row.max() <= never_at + 1e-9:
            reason = UNSOLVED
        elif row.std() < min_std:
            reason = FLAT
        else:
            reason = KEEP
        out.append(PromptRecord(prompt, reason, float(row.mean()), float(row.min()),
                                float(row.max()), float(row.std())))  # fmt: skip
    return out


def training_pool(
    records: Sequence[PromptRecord],
    hard_repeats: int = 1,
    keep_unsolved: bool = False,
    keep_solved: bool = False,
) -> list[str]:
    """The prompts to train on, in record order: the kept ones, the never-solved ones with
    ``keep_unsolved`` and the always-solved ones with ``keep_solved`` (worth training on
    when a dense reward gives their groups a spread the pass/fail one does not, and the
    solved ones anchor what the hard ones' updates would otherwise trade away); each
    repeated 1 + round((``hard_repeats`` - 1)(1 - mean)) times, ``mean`` its pool mean
    reward in [0, 1], so that the prompts the model fails most are drawn up to
    ``hard_repeats`` times as often as the nearly solved."""
    if hard_repeats < 1:
        raise ValueError(f"hard_repeats={hard_repeats} must be at least 1")
    out = []
    for r in records:
        if (
            r.kept
            or (keep_unsolved and r.reason == UNSOLVED)
            or (keep_solved and r.reason == SOLVED)
        ):
            miss = 1.0 - min(max(r.mean, 0.0), 1.0)
            out += [r.prompt] * (1 + int((hard_repeats - 1) * miss + 0.5))
    return out


def reason_counts(records: Sequence[PromptRecord]) -> dict[str, int]:
    """How many prompts each verdict got (every verdict listed, zeros included)."""
    return {k: sum(r.reason == k for r in records) for k in (KEEP, SOLVED, UNSOLVED, FLAT)}


def write_records(path: Path, records: Sequence[PromptRecord], settings: dict) -> Path:
    """``{"settings", "counts", "prompts": [record, ...]}`` to ``path`` (atomically)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    data = {"settings": settings, "counts": reason_counts(records),
            "prompts": [asdict(r) for r in records]}  # fmt: skip
    tmp.write_text(json.dumps(data, indent=1))
    tmp.rename(path)
    return path


def read_records(path: Path) -> list[PromptRecord]:
    return [PromptRecord(**row) for row in json.loads(Path(path).read_text())["prompts"]]


def pool_statistics(
    job: Any, stage_index: int, prompts: Sequence[str], reward: Any, group_size: int,
    steps: int, seed: int = 5000,
) -> np.ndarray:  # fmt: skip
    """Rewards [P, G] of ``group_size`` no-CFG samples per prompt (seeds ``seed ..``,
    ``steps`` Euler steps) of ``job.stages[stage_index]``'s newest checkpoint."""
    from krea2.trainer import sample_stage

    seeds = list(range(seed, seed + group_size))
    images = sample_stage(job, stage_index, list(prompts), seeds, steps, 0.0)
    flat = images.reshape(-1, *images.shape[2:])
    out = reward(flat, [p for p in prompts for _ in seeds])
    return np.asarray(out.scores, np.float64).reshape(len(prompts), group_size)
