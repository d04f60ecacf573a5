"""The whole cheap DAG on a defect-laden ShapesWorld pool: precision and recall per class."""

from __future__ import annotations

import pytest

from krea2.curate.config import CurateConfig
from krea2.curate.evaluate import clean_kept, pair_precision_recall, precision_recall
from krea2.curate.in_memory import curate_in_memory, dedup_analyses
from krea2.curate.shapes import shapes_tagger
from krea2.curate.shapes.defects import DEFECT_CLASSES, make_pool


@pytest.fixture(scope="module")
def pool_verdicts(ocr_engine):
    pool = make_pool(seed=0, n_clean=60, n_per_defect=10, n_overrepresented=20)
    verdicts = curate_in_memory(
        [it.key for it in pool], [it.data for it in pool], ocr=ocr_engine, tagger=shapes_tagger
    )
    return pool, verdicts


def detection_reasons(verdicts) -> list[str | None]:
    """Final reasons, except that membership of an over-represented concept counts as its
    detection (the cap then keeps a fair share of those images on purpose)."""
    return [
        v.reason or ("overrepresented" if v.concept and v.concept.overrepresented else None)
        for v in verdicts
    ]


def test_every_defect_class_is_caught_with_high_precision_and_recall(pool_verdicts):
    pool, verdicts = pool_verdicts
    labels = [it.label for it in pool]
    metrics = precision_recall(labels, detection_reasons(verdicts))
    assert set(metrics) == set(DEFECT_CLASSES)
    for cls, m in metrics.items():
        assert m["precision"] >= 0.95, (cls, m)
        assert m["recall"] >= 0.95, (cls, m)
    assert clean_kept(labels, [v.reason for v in verdicts]) >= 0.95


def test_the_concept_cap_keeps_a_fair_share_of_the_overrepresented_concept(pool_verdicts):
    pool, verdicts = pool_verdicts
    survivors = [v for v in verdicts if v.reason is None]
    red_circles = [
        v
        for v, it in zip(verdicts, pool, strict=True)
        if it.label == "overrepresented" and v.reason is None
    ]
    assert 0 < len(red_circles) <= 0.15 * len([v for v in verdicts if v.concept is not None])
    assert len(survivors) >= 60  # the 60 clean images and the kept red circles


def test_near_duplicates_are_found_with_high_pair_precision_and_recall():
    pool = make_pool(
        seed=1, n_clean=200, n_per_defect=40, classes=("exact_duplicate", "near_duplicate")
    )
    verdicts = curate_in_memory([it.key for it in pool], [it.data for it in pool])
    labels = [it.label for it in pool]
    metrics = precision_recall(labels, [v.reason for v in verdicts])
    assert metrics["near_duplicate"]["precision"] >= 0.99, metrics
    assert metrics["near_duplicate"]["recall"] >= 0.95, metrics
    assert metrics["exact_duplicate"]["precision"] == metrics["exact_duplicate"]["recall"] == 1.0
    # The keep rule (largest, then earliest) always keeps the clean original.
    assert all(
        v.reason is None for v, it in zip(verdicts, pool, strict=True) if it.label == "clean"
    )
    true_groups: dict[str, list[int]] = {}
    for i, it in enumerate(pool):
        true_groups.setdefault(it.source or it.key, []).append(i)
    result = dedup_analyses(
        [v.analysis for v in verdicts], CurateConfig(), [it.data for it in pool]
    )
    pairs = pair_precision_recall(result.groups(), list(true_groups.values()))
    assert pairs["precision"] >= 0.99 and pairs["recall"] >= 0.95, pairs
