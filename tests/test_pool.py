"""The demo's raw pool is the same whether one or two processes render it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from krea2.pipeline.config import PoolSpec
from krea2.pipeline.pool import build_pool, read_labels
from krea2.pipeline.world import split_concepts


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_pool_built_by_two_processes_matches_one(tmp_path):
    spec = PoolSpec(per_concept=1, side=96, n_clean_multi=4, n_per_defect=1, n_overrepresented=3)
    split = split_concepts(spec.seed, spec.held_out_fraction)
    one = build_pool(spec, split, tmp_path / "one", workers=1)
    two = build_pool(spec, split, tmp_path / "two", workers=2)
    assert one["one_object"] > 20 and one["by_label"] == two["by_label"]
    assert digest(tmp_path / "one") == digest(tmp_path / "two")
    labels = read_labels(Path(one["labels"]))
    assert sum(m["label"] == "clean" for m in labels.values()) >= one["one_object"]


def test_every_one_object_render_is_in_the_pool_and_dedup_folds_exactly_the_variants(tmp_path):
    from krea2.curate import CurateConfig, analyze_bytes, dedup_analyses
    from krea2.pipeline.pool import VARIANT

    spec = PoolSpec(
        per_concept=3, rerenders=1, side=96, n_clean_multi=4, n_per_defect=1, n_overrepresented=3
    )
    split = split_concepts(spec.seed, spec.held_out_fraction)
    pool = build_pool(spec, split, tmp_path, workers=1)
    assert pool["one_object"] + pool["one_object_variants"] == 3 * 2 * len(split.train)
    assert pool["one_object_variants"] > 0
    labels = read_labels(Path(pool["labels"]))
    world = sorted(f for f, m in labels.items() if m["key"].startswith("world-"))
    # In pool order, as ingest sees them: dedup keeps the clean renders, folds the variants.
    result = dedup_analyses(
        [analyze_bytes((tmp_path / f).read_bytes(), CurateConfig()) for f in world], CurateConfig()
    )
    assert [labels[f]["label"] != VARIANT for f in world] == result.keep.tolist()


def test_rerenders_nudge_their_scene_and_leave_the_candidates_unchanged():
    from krea2.pipeline.world import one_object_scenes

    split = split_concepts(0, 0.15)
    base = one_object_scenes(split, 3, seed=0)
    scenes = one_object_scenes(split, 3, seed=0, rerenders=2, nudge=0.05)
    assert len(scenes) == 3 * len(base) and scenes[::3] == base
    for k, scene in enumerate(scenes):
        original = scenes[k - k % 3].objects[0]
        obj = scene.objects[0]
        assert (obj.shape, obj.color, obj.cell, obj.size) == (
            original.shape,
            original.color,
            original.cell,
            original.size,
        )
        assert scene.background == scenes[k - k % 3].background
        assert max(abs(a - b) for a, b in zip(obj.jitter, original.jitter, strict=True)) <= 0.05
