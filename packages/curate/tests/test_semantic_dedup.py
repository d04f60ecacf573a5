"""Semantic dedup inside bounded leaves, and hierarchical k-means with balanced sampling."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.kmeans import balanced_sample, hierarchical_kmeans
from krea2.curate.semantic_dedup import bounded_leaves, keep_rule, leaf_pairs, semantic_dedup


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def with_copies(n: int, copies: int, d: int = 32, noise: float = 0.05, seed: int = 0):
    """n distinct unit vectors, then ``copies`` noisy copies of the first ones."""
    rng = np.random.default_rng(seed)
    base = unit(rng.normal(size=(n, d)))
    dup = unit(base[:copies] + noise * rng.normal(size=(copies, d)))
    return np.concatenate([base, dup]), np.r_[np.full(n, -1), np.arange(copies)]


def test_the_keeper_is_the_best_ranked_row_whatever_the_storage_order():
    x = unit(np.array([[1.0, 0.0], [0.99, 0.05], [0.98, 0.1]]))
    pairs, sims = leaf_pairs(x, 0.95)
    keep, dup_of, sim = keep_rule(3, np.array([2, 0, 1]), pairs, sims)
    assert keep.tolist() == [False, True, False]
    assert dup_of.tolist() == [1, -1, 1]
    assert sim[0] == pytest.approx(float(x[0] @ x[1]), abs=1e-6)


def test_chains_stop_at_a_keeper():
    # a≈b and b≈c but a and c are not similar: a kept, b dropped, c kept (it is like no keeper).
    t = np.radians([0.0, 10.0, 20.0])
    x = unit(np.stack([np.cos(t), np.sin(t)], axis=1))
    pairs, sims = leaf_pairs(x, float(np.cos(np.radians(12))))
    keep, dup_of, _ = keep_rule(3, np.arange(3), pairs, sims)
    assert keep.tolist() == [True, False, True] and dup_of.tolist() == [-1, 0, -1]


def test_copies_are_found_and_distinct_vectors_kept():
    x, source = with_copies(2000, 200)
    h = hierarchical_kmeans(x, [20, 4])
    res = semantic_dedup(x.astype(np.float16), np.arange(len(x)), h.leaf, threshold=0.9)
    dropped = np.flatnonzero(~res.keep)
    assert set(dropped) == set(range(2000, 2200))
    assert (res.dup_of[dropped] == source[dropped]).all()


def test_probing_neighbouring_leaves_finds_copies_across_a_leaf_boundary():
    # Structureless vectors put many copies in another leaf than their source.
    x, _ = with_copies(2000, 200)
    leaf = hierarchical_kmeans(x, [20]).leaf
    alone = semantic_dedup(x, np.arange(len(x)), leaf, threshold=0.9, probe=1)
    probed = semantic_dedup(x, np.arange(len(x)), leaf, threshold=0.9)
    assert (~alone.keep).sum() < 200 == (~probed.keep).sum()


def test_leaves_are_bounded():
    x, _ = with_copies(3000, 0)
    leaves = bounded_leaves(x, np.zeros(len(x), np.int64), max_leaf=256)
    assert np.bincount(leaves).max() <= 256
    same = bounded_leaves(np.ones((600, 4), np.float32) / 2, np.zeros(600, np.int64), 256)
    assert np.bincount(same).max() <= 256  # identical vectors: cut into runs


def test_hierarchy_levels_nest():
    x, _ = with_copies(1500, 0, d=16)
    h = hierarchical_kmeans(x, [30, 6, 2])
    paths = h.paths()
    assert paths.shape == (1500, 3)
    assert len(np.unique(paths[:, 0])) <= 30 and len(np.unique(paths[:, 2])) <= 2
    # every leaf has one parent
    for leaf in np.unique(paths[:, 0]):
        assert len(np.unique(paths[paths[:, 0] == leaf, 1])) == 1
    with pytest.raises(ValueError, match="non-increasing"):
        hierarchical_kmeans(x, [2, 6])


def test_balanced_sampling_caps_the_head_and_keeps_the_tail():
    rng = np.random.default_rng(0)
    centres = unit(rng.normal(size=(10, 16)))
    sizes = [2000] + [20] * 9  # one head concept, nine rare ones
    x = unit(
        np.concatenate(
            [c + 0.05 * rng.normal(size=(s, 16)) for c, s in zip(centres, sizes, strict=True)]
        )
    )
    concept = np.repeat(np.arange(10), sizes)
    h = hierarchical_kmeans(x, [40, 10])
    picked = balanced_sample(h, 400)
    assert len(picked) == len(np.unique(picked)) == 400
    counts = np.bincount(concept[picked], minlength=10)
    # The tail keeps most of its images (a leaf shared with head images shares its budget)
    # where a uniform draw of the same size keeps about a fifth of them.
    uniform = np.bincount(concept[rng.choice(len(x), 400, replace=False)], minlength=10)
    assert counts[1:].sum() >= 0.75 * 180 > 2 * uniform[1:].sum(), (counts, uniform)
    assert counts[1:].min() >= 10 and counts[0] <= 260, counts
