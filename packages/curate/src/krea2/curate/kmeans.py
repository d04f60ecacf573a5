"""Hierarchical k-means over embeddings (FAISS), after Vo et al. 2024 (arXiv 2405.15613).

Level 1 clusters the vectors into ``k[0]`` clusters (the leaves); level 2 clusters the
level-1 centroids into ``k[1]``, and so on up to a small top level, so a leaf's path is
(top, …, leaf). Each level is fitted on a bounded sample (``max_train`` points; FAISS also
caps points per centroid), and the assignment streams the vectors in chunks, so the
vectors may be an ``np.memmap`` larger than memory: what is held is the sample, the
centroids and one int per vector.

``balanced_sample`` is the paper's hierarchical sampling: a budget is split as evenly as
possible among the top clusters (a cluster smaller than its share gives the rest back to
its siblings), recursively down to the leaves, where points are drawn at random. Head
concepts (huge clusters) are capped and the long tail (small clusters) is kept whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import faiss
import numpy as np

CHUNK = 65536  # vectors assigned per FAISS call


@dataclass(frozen=True)
class Hierarchy:
    """``assign[l]``: (n_l,) int cluster at level l+1 of each level-l item (level 0 = the
    vectors, so ``assign[0]`` is each vector's leaf); ``centroids[l]``: (k_l, d) float32."""

    assign: tuple[np.ndarray, ...]
    centroids: tuple[np.ndarray, ...]

    @property
    def leaf(self) -> np.ndarray:
        """(n,) leaf id of each vector."""
        return self.assign[0]

    def paths(self) -> np.ndarray:
        """(n, levels) cluster id of each vector at every level, leaf first."""
        cols = [self.assign[0]]
        for a in self.assign[1:]:
            cols.append(a[cols[-1]])
        return np.stack(cols, axis=1)


def _train(x: np.ndarray, k: int, seed: int, niter: int, max_train: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = len(x)
    take = np.sort(rng.choice(n, size=min(n, max_train), replace=False))
    sample = np.ascontiguousarray(x[take], np.float32)
    k = max(1, min(k, len(sample)))
    km = faiss.Kmeans(
        sample.shape[1],
        k,
        niter=niter,
        seed=seed,
        spherical=True,
        max_points_per_centroid=max(1, max_train // k),
        verbose=False,
    )
    km.train(sample)
    return km.centroids.copy()


def assign_nearest(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(n,) index of the nearest centroid (inner product, unit vectors) of each row of
    ``x`` (n, d), ``CHUNK`` rows at a time (x may be a float16 memmap)."""
    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, np.float32))
    out = np.empty(len(x), np.int64)
    for s in range(0, len(x), CHUNK):
        _, nearest = index.search(np.ascontiguousarray(x[s : s + CHUNK], np.float32), 1)
        out[s : s + CHUNK] = nearest[:, 0]
    return out


def hierarchical_kmeans(
    x: np.ndarray, k: Sequence[int], seed: int = 0, niter: int = 20, max_train: int = 200_000
) -> Hierarchy:
    """Cluster unit vectors ``x`` (n, d) into levels of ``k`` clusters (leaf level first,
    decreasing): level 1 over the vectors, level l+1 over level l's centroids."""
    if not len(k) or any(b > a for a, b in pairwise(k)):
        raise ValueError(f"k per level must be non-empty and non-increasing, got {list(k)}")
    assign: list[np.ndarray] = []
    cents: list[np.ndarray] = []
    items = x
    for level, kl in enumerate(k):
        c = _train(items, kl, seed + level, niter, max_train)
        assign.append(assign_nearest(items, c))
        cents.append(c)
        items = c
    return Hierarchy(tuple(assign), tuple(cents))


def _split_budget(budget: int, sizes: np.ndarray) -> np.ndarray:
    """Split ``budget`` over groups of ``sizes`` as evenly as possible, none above its size
    (water-filling: small groups are taken whole, the rest share what is left)."""
    take = np.zeros(len(sizes), np.int64)
    left = min(budget, int(sizes.sum()))
    open_ = sizes > 0
    while left > 0 and open_.any():
        share = max(1, left // int(open_.sum()))
        room = sizes - take
        add = np.where(open_, np.minimum(room, share), 0)
        if add.sum() > left:  # the last units go to the groups in order
            order = np.flatnonzero(open_)
            add[:] = 0
            add[order[:left]] = 1
        take += add
        left -= int(add.sum())
        open_ &= take < sizes
    return take


def balanced_sample(h: Hierarchy, budget: int, seed: int = 0) -> np.ndarray:
    """Indices of ``budget`` vectors drawn top-down, evenly over the clusters of each
    level (``_split_budget``), then at random inside each leaf; sorted."""
    return sample_paths(h.paths(), budget, seed)


def sample_paths(paths: np.ndarray, budget: int, seed: int = 0) -> np.ndarray:
    """``balanced_sample`` over (n, L) int cluster ids per level, leaf first (as
    ``Hierarchy.paths``; the warehouse's ``cluster`` column reversed)."""
    rng = np.random.default_rng(seed)
    paths = np.asarray(paths, np.int64).reshape(len(paths), -1)
    top = paths.shape[1] - 1

    def draw(members: np.ndarray, level: int, want: int) -> list[np.ndarray]:
        if want <= 0 or not len(members):
            return []
        if level < 0:
            return [rng.choice(members, size=want, replace=False)]
        groups, inverse = np.unique(paths[members, level], return_inverse=True)
        sizes = np.bincount(inverse, minlength=len(groups))
        out: list[np.ndarray] = []
        for g, t in enumerate(_split_budget(want, sizes)):
            out += draw(members[inverse == g], level - 1, int(t))
        return out

    parts = draw(np.arange(len(paths)), top, budget)
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
