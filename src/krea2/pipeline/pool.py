"""The demo's raw pool: one-object training scenes plus every injected defect, on disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from krea2.curate.analysis import analyze_bytes
from krea2.curate.config import CurateConfig
from krea2.curate.shapes import render
from krea2.curate.shapes.defects import PoolItem, encode, make_pool, write_pool
from krea2.pipeline.config import PoolSpec
from krea2.pipeline.world import WorldSplit, one_object_scenes


def distinct(images: list[bytes], cfg: CurateConfig) -> list[int]:
    """Indices of the images curate's dedup keeps (one per duplicate group, the earliest
    among equals). No two keepers are near duplicates (they would share a group), so a
    "clean" label on them means the warehouse should keep them."""
    from krea2.curate.pipeline import dedup_analyses

    result = dedup_analyses([analyze_bytes(data, cfg) for data in images], cfg)
    return [int(i) for i in np.nonzero(result.keep)[0]]


def build_pool(spec: PoolSpec, split: WorldSplit, directory: Path) -> dict:
    """Write the pool's files and ``labels.jsonl`` (ground truth per file) into ``directory``."""
    candidates = one_object_scenes(split, spec.per_concept, spec.seed)
    images = [encode(render(s, spec.side, spec.side), "png") for s in candidates]
    world = [
        PoolItem(f"world-{n:05d}", images[i], "png", "clean", scene=candidates[i])
        for n, i in enumerate(distinct(images, CurateConfig()))
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
        "one_object": len(world),
        "by_label": counts,
    }


def read_labels(path: Path) -> dict[str, dict]:
    """``labels.jsonl`` keyed by file name."""
    return {m["file"]: m for m in map(json.loads, Path(path).read_text().splitlines())}
