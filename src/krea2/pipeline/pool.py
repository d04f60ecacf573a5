"""The demo's raw pool: one-object training scenes plus every injected defect, on disk."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from krea2.curate import CurateConfig, ImageAnalysis, analyze_bytes
from krea2.curate.shapes import (
    PoolItem,
    Scene,
    WorldSplit,
    encode,
    make_pool,
    one_object_scenes,
    render,
    write_pool,
)
from krea2.pipeline.config import PoolSpec

# The label of a one-object render that curate's dedup folds into an earlier render of the
# same concept (a re-render nudged by under a pixel, or another take of the concept): the
# raw pool's many near-identical pictures of one thing. Which of them are duplicates is
# decided by the dedup itself, not known independently, so they carry no ground truth and
# precision/recall leave them out (the funnel counts them apart).
VARIANT = "variant"


def distinct(analyses: list[ImageAnalysis], cfg: CurateConfig) -> list[int]:
    """Indices of the images curate's dedup keeps (one per duplicate group, the earliest
    among equals). No two keepers are near duplicates (they would share a group), so a
    "clean" label on them means the warehouse should keep them."""
    from krea2.curate import dedup_analyses

    result = dedup_analyses(analyses, cfg)
    return [int(i) for i in np.nonzero(result.keep)[0]]


def render_and_analyze(job: tuple[Scene, int]) -> tuple[bytes, ImageAnalysis]:
    """A square scene of ``side`` px as PNG bytes, and curate's analysis of those bytes."""
    scene, side = job
    data = encode(render(scene, side, side), "png")
    return data, analyze_bytes(data, CurateConfig())


def parallel_map(fn: Callable, items: Sequence, workers: int) -> list:
    """``[fn(x) for x in items]`` over ``workers`` spawned processes (in order). Spawned, not
    forked: the demo's process may hold torch's and OpenMP's threads, which fork breaks."""
    if workers <= 1 or len(items) < 4 * workers:
        return [fn(x) for x in items]
    chunk = max(1, len(items) // (8 * workers))
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return list(pool.map(fn, items, chunksize=chunk))


def build_pool(spec: PoolSpec, split: WorldSplit, directory: Path, workers: int = 1) -> dict:
    """Write the pool's files and ``labels.jsonl`` (ground truth per file) into ``directory``.
    The one-object scenes are rendered and analysed by ``workers`` processes; all of them
    go into the pool, in render order, the ones dedup keeps labelled ``clean``."""
    candidates = one_object_scenes(split, spec.per_concept, spec.seed, spec.rerenders)
    done = parallel_map(render_and_analyze, [(s, spec.side) for s in candidates], workers)
    keep = set(distinct([a for _, a in done], CurateConfig()))
    world = [
        PoolItem(f"world-{i:05d}", data, "png", "clean" if i in keep else VARIANT, scene=scene)
        for i, ((data, _), scene) in enumerate(zip(done, candidates, strict=True))
    ]
    injected = make_pool(
        seed=spec.seed,
        n_clean=spec.n_clean_multi,
        n_per_defect=spec.n_per_defect,
        n_overrepresented=spec.n_overrepresented,
        min_side=spec.side,
        max_side=spec.side + 64,
    )
    # Interleave without reordering the injected items: their originals precede their copies.
    rng = np.random.default_rng(spec.seed)
    slots = np.sort(rng.choice(len(world) + len(injected), len(world), replace=False))
    items: list[PoolItem] = []
    w = iter(world)
    inj = iter(injected)
    slot_set = set(slots.tolist())
    for i in range(len(world) + len(injected)):
        items.append(next(w) if i in slot_set else next(inj))
    labels = write_pool(items, directory)
    counts: dict[str, int] = {}
    for it in items:
        counts[it.label] = counts.get(it.label, 0) + 1
    return {
        "labels": str(labels),
        "images": len(items),
        "one_object": sum(it.label == "clean" for it in world),
        "one_object_variants": sum(it.label == VARIANT for it in world),
        "by_label": counts,
    }


def read_labels(path: Path) -> dict[str, dict]:
    """``labels.jsonl`` keyed by file name."""
    return {m["file"]: m for m in map(json.loads, Path(path).read_text().splitlines())}
