"""The demo's raw pool: one-object training scenes plus every injected defect, on disk."""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import signal
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

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
from krea2.infra import UserError
from krea2.infra.progress import track
from krea2.pipeline.config import PoolSpec

# The label of a later take of a concept: another render of one thing (its own size, jitter
# and background) that hash dedup may or may not fold into the concept's first render. The
# generator knows it is a distinct render of the same concept, not whether it should count
# as a near duplicate, so it carries no ground truth: precision/recall leave it out and the
# funnel counts its outcomes apart.
VARIANT = "variant"
ONE_OBJECT_PREFIX = "world-"  # pool keys of the one-object renders
COPY_MIN_KEPT = 0.78  # the least share of each side a copy's crop keeps (``shapes.copies``)
# Crops and colour-preserving tone and blur edits. No mirrors: a ShapesWorld caption says where
# things are, and the mirror of a one-object scene ("a blue circle on the left") is another
# scene of the pool ("... on the right") pixel for pixel, so a flip is a new scene here.
DEMO_COPY_EDITS = ("crop", "tone", "degrade")
MIN_CROPPED_SIDE = 256  # px: the 256 stage's minimum side, which a cropped copy must keep


def is_one_object(entry: dict) -> bool:
    """Whether a ``labels.jsonl`` entry is one of the one-object renders."""
    return str(entry["key"]).startswith(ONE_OBJECT_PREFIX)


def one_object_labels(
    scenes: Sequence[Scene], renders: Sequence[bytes], rerenders: int
) -> list[str]:
    """Ground truth of the one-object renders, from what the generator made (the order of
    :func:`krea2.curate.shapes.one_object_scenes`: each take followed by ``rerenders``
    re-renders nudged under a pixel). A render whose bytes equal an earlier one's is an
    ``exact_duplicate``; a re-render is a ``near_duplicate`` of its take; the first take of
    each concept is ``clean``; later takes are variants."""
    seen_bytes: set[bytes] = set()
    seen_concepts: set[tuple] = set()
    labels = []
    for i, (scene, data) in enumerate(zip(scenes, renders, strict=True)):
        obj = scene.objects[0]
        concept = (obj.color, obj.shape, obj.cell)
        digest = hashlib.md5(data).digest()
        if digest in seen_bytes:
            labels.append("exact_duplicate")
        elif i % (rerenders + 1):
            labels.append("near_duplicate")
        elif concept not in seen_concepts:
            labels.append("clean")
        else:
            labels.append(VARIANT)
        seen_bytes.add(digest)
        seen_concepts.add(concept)
    return labels


def render_png(job: tuple[Scene, int]) -> bytes:
    """A square scene of ``side`` px as PNG bytes."""
    scene, side = job
    return encode(render(scene, side, side), "png")


def parallel_map(fn: Callable, items: Sequence, workers: int, description: str) -> list:
    """``[fn(x) for x in items]`` over ``workers`` spawned processes (in order), with a
    progress line per result under ``description``. Spawned, not forked: the demo's process
    may hold torch's and OpenMP's threads, which fork breaks."""
    if workers <= 1 or len(items) < 4 * workers:
        return list(track(map(fn, items), description, total=len(items), unit="img"))
    chunk = max(1, len(items) // (8 * workers))
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=ctx)
    try:
        # A terminal's Ctrl-C reaches every process of the group; only this one should
        # handle it. A spawned child inherits an ignored SIGINT (and then Python installs
        # no KeyboardInterrupt handler), so ignore it while the workers are started: the
        # submits of ``map`` start them, without waiting for their imports.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            results = pool.map(fn, items, chunksize=chunk)
        finally:
            signal.signal(signal.SIGINT, previous)
        return list(track(results, description, total=len(items), unit="img"))
    finally:
        # On Ctrl-C, drop the queued chunks instead of rendering them all before exiting.
        pool.shutdown(wait=True, cancel_futures=True)


def build_pool(spec: PoolSpec, split: WorldSplit, directory: Path, workers: int = 1) -> dict:
    """Write the pool's files, their sidecars and ``labels.jsonl`` (ground truth per file,
    from the generator) into ``directory``. The one-object scenes are rendered by ``workers``
    processes; all of them go into the pool, in render order."""
    candidates = one_object_scenes(split, spec.per_concept, spec.seed, spec.rerenders,
                                   styled=spec.styled)  # fmt: skip
    jobs = [(s, spec.side) for s in candidates]
    renders = parallel_map(render_png, jobs, workers, "pool render")
    truth = one_object_labels(candidates, renders, spec.rerenders)
    world = [
        PoolItem(f"{ONE_OBJECT_PREFIX}{i:05d}", data, "png", label, scene=scene)
        for i, (data, scene, label) in enumerate(zip(renders, candidates, truth, strict=True))
    ]
    if not 0 <= spec.n_copies <= spec.n_clean_multi:
        raise UserError(
            f"pool.n_copies {spec.n_copies} must be between 0 and pool.n_clean_multi "
            f"({spec.n_clean_multi}): each copy is of a different clean scene"
        )
    # A copy's crop keeps ≥ 78% of each side; the multi-object scenes are drawn large enough
    # that it still passes the 256 px minimum, so every copy reaches embedding dedup.
    multi_side = max(spec.side, math.ceil(MIN_CROPPED_SIDE / COPY_MIN_KEPT))
    injected = make_pool(
        seed=spec.seed,
        n_clean=spec.n_clean_multi,
        n_per_defect=spec.n_per_defect,
        n_overrepresented=spec.n_overrepresented,
        min_side=multi_side,
        max_side=multi_side + 64,
        n_copies=spec.n_copies,
        copy_edits=DEMO_COPY_EDITS,
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
        "one_object": len(world),
        "one_object_by_label": dict(Counter(truth)),
        "by_label": counts,
    }


def read_labels(path: Path) -> dict[str, dict]:
    """``labels.jsonl`` keyed by file name."""
    return {m["file"]: m for m in map(json.loads, Path(path).read_text().splitlines())}
