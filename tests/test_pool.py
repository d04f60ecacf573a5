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
