"""Semantic dedup: cosine similarity within bounded leaf clusters, one keeper per copy set.

Copies (crops, flips, tone edits) sit within a small angle of their source, so they land in
the same k-means leaf and only pairs inside a leaf are compared (SemDeDup's blocking, with
the leaves of ``krea2.curate.kmeans``). A leaf larger than ``max_leaf`` is split again by
k-means until it fits, so the per-leaf work is bounded: FAISS range search over at most
``max_leaf`` vectors, memory O(max_leaf · d) plus the pairs found.

**Keep rule.** Inside a leaf, rows are visited by ``rank`` (lower first; the warehouse
passes part 1's rule: largest image, then earliest ingest). A row whose cosine similarity
to an already *kept* row is at least ``threshold`` is a duplicate of the most similar such
keeper; otherwise it is kept. Comparing with keepers only (not with every earlier row, as
SemDeDup's released code does) stops chains — A≈B≈C with A and C distinct keeps C — and
makes the keeper independent of storage order (SemDeDup issue #8).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import faiss
import numpy as np

from krea2.curate.kmeans import CHUNK, assign_nearest


@dataclass(frozen=True)
class SemanticDedupResult:
    """For n rows: ``keep`` (n,) bool; ``dup_of`` (n,) int64 row index of the keeper a
    duplicate was matched to (-1 for keepers); ``similarity`` (n,) float32 cosine to it
    (0 for keepers); ``leaf`` (n,) int64 bounded leaf id the row was compared in."""

    keep: np.ndarray
    dup_of: np.ndarray
    similarity: np.ndarray
    leaf: np.ndarray

    def pairs(self) -> np.ndarray:
        """(m, 2) int64 (keeper, duplicate) edges."""
        d = np.flatnonzero(~self.keep)
        return np.stack([self.dup_of[d], d], axis=1)


def bounded_leaves(x: np.ndarray, leaf: np.ndarray, max_leaf: int, seed: int = 0) -> np.ndarray:
    """Relabel ``leaf`` (n,) so no leaf has more than ``max_leaf`` rows: each oversized leaf
    is split by k-means into ⌈size / (max_leaf / 2)⌉ parts, again if a part is still too
    big; a leaf k-means cannot split (identical vectors) is cut into consecutive runs."""
    out = np.asarray(leaf, np.int64).copy()
    next_id = int(out.max()) + 1 if len(out) else 0
    todo = [int(v) for v in np.flatnonzero(np.bincount(out) > max_leaf)] if len(out) else []
    while todo:
        members = np.flatnonzero(out == todo.pop())
        xs = np.ascontiguousarray(x[members], np.float32)
        k = int(np.ceil(len(members) / max(1, max_leaf // 2)))
        km = faiss.Kmeans(xs.shape[1], k, niter=10, seed=seed, spherical=True, verbose=False)
        km.train(xs)
        parts = assign_nearest(xs, km.centroids)
        if np.bincount(parts).max() == len(members):  # k-means could not split it
            parts = np.arange(len(members)) // max_leaf
        for p in np.unique(parts):
            sel = members[parts == p]
            out[sel] = next_id
            if len(sel) > max_leaf:
                todo.append(next_id)
            next_id += 1
    return out


def leaf_pairs(xs: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of rows of unit vectors ``xs`` (m, d) with cosine ≥ ``threshold``: ((p, 2) int64
    i < j, (p,) float32 similarity)."""
    xs = np.ascontiguousarray(xs, np.float32)
    index = faiss.IndexFlatIP(xs.shape[1])
    index.add(xs)
    # FAISS keeps inner products strictly above the radius; step just below the threshold.
    lims, sims, ids = index.range_search(xs, float(np.nextafter(np.float32(threshold), -1)))
    rows = np.repeat(np.arange(len(xs)), np.diff(lims).astype(np.int64))
    keep = ids > rows
    return np.stack([rows[keep], ids[keep]], axis=1).astype(np.int64), sims[keep]


def leaf_centroids(x: np.ndarray, leaf: np.ndarray) -> np.ndarray:
    """(k, d) float32 unit mean of each leaf's rows (leaf ids 0..k-1), summed in chunks."""
    k = int(leaf.max()) + 1
    sums = np.zeros((k, x.shape[1]), np.float64)
    for s in range(0, len(x), CHUNK):
        np.add.at(sums, leaf[s : s + CHUNK], np.asarray(x[s : s + CHUNK], np.float64))
    norm = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.maximum(norm, 1e-12)).astype(np.float32)


def leaf_buckets(
    x: np.ndarray, leaf: np.ndarray, probe: int, margin: float
) -> tuple[np.ndarray, np.ndarray]:
    """Rows compared together: each row sits in its own leaf's bucket and also visits up to
    ``probe`` − 1 neighbouring leaves whose centroid is within ``margin`` (cosine) of its
    own leaf's, so a copy just across a leaf boundary still meets its source.
    Returns (rows, buckets): (m,) int64 each, one entry per (row, bucket) membership."""
    if probe <= 1:
        return np.arange(len(x)), np.asarray(leaf, np.int64)
    cents = leaf_centroids(x, leaf)
    index = faiss.IndexFlatIP(cents.shape[1])
    index.add(cents)
    rows, buckets = [np.arange(len(x))], [np.asarray(leaf, np.int64)]
    for s in range(0, len(x), CHUNK):
        chunk = np.ascontiguousarray(x[s : s + CHUNK], np.float32)
        sims, near = index.search(chunk, min(probe, len(cents)))
        own = (chunk * cents[leaf[s : s + CHUNK]]).sum(1)
        visit = (near != leaf[s : s + CHUNK, None]) & (sims >= own[:, None] - margin)
        r, c = np.nonzero(visit)
        rows.append(s + r)
        buckets.append(near[r, c])
    return np.concatenate(rows), np.concatenate(buckets)


def keep_rule(n: int, rank: np.ndarray, pairs: np.ndarray, sims: np.ndarray) -> tuple:
    """The keep rule over all (p, 2) similar ``pairs`` with similarities ``sims``: rows in
    ``rank`` order; a row similar to a kept row is a duplicate of the most similar one.
    Returns (keep (n,) bool, dup_of (n,) int64 or -1, similarity (n,) float32)."""
    keep = np.ones(n, bool)
    dup_of = np.full(n, -1, np.int64)
    sim_to = np.zeros(n, np.float32)
    if not len(pairs):
        return keep, dup_of, sim_to
    a, b = pairs[:, 0], pairs[:, 1]
    before = (rank[a] < rank[b]) | ((rank[a] == rank[b]) & (a < b))
    first, later = np.where(before, a, b), np.where(before, b, a)
    by_later: dict[int, list[tuple[float, int]]] = {}
    for f, lt, s in zip(first.tolist(), later.tolist(), sims.tolist(), strict=True):
        by_later.setdefault(lt, []).append((s, f))
    for j in sorted(by_later, key=lambda r: (rank[r], r)):  # rank order: keepers are final
        kept = [(s, f) for s, f in by_later[j] if keep[f]]
        if kept:
            s, f = max(kept)
            keep[j], dup_of[j], sim_to[j] = False, f, s
    return keep, dup_of, sim_to


def similar_pairs(
    x: np.ndarray,
    leaf: np.ndarray,
    threshold: float,
    max_leaf: int = 4096,
    probe: int = 3,
    margin: float = 0.1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of rows of unit vectors ``x`` (n, d) (may be a float16 memmap) with
    cosine ≥ ``threshold`` that share a bucket: ``leaf`` (n,) clusters bounded to
    ``max_leaf`` rows plus the boundary visitors of ``leaf_buckets``. Returns ((p, 2) int64
    unique pairs i < j, (p,) float32 similarities, (n,) bounded leaf ids). Memory: one
    bucket's vectors and the pairs found."""
    n = len(x)
    leaves = bounded_leaves(x, leaf, max_leaf)
    rows, buckets = leaf_buckets(x, leaves, probe, margin)
    order = np.argsort(buckets, kind="stable")
    rows, buckets = rows[order], buckets[order]
    bounds = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1], True])
    found, found_sims = [np.zeros((0, 2), np.int64)], [np.zeros(0, np.float32)]
    for s, e in pairwise(bounds):
        members = np.sort(rows[s:e])
        if len(members) < 2:
            continue
        pairs, sims = leaf_pairs(x[members], threshold)
        found.append(members[pairs])
        found_sims.append(sims)
    pairs, sims = np.concatenate(found), np.concatenate(found_sims)
    if len(pairs):  # a pair met in two buckets is counted once
        packed, first = np.unique(pairs[:, 0] * n + pairs[:, 1], return_index=True)
        pairs, sims = np.stack([packed // n, packed % n], axis=1), sims[first]
    return pairs, sims, leaves


def semantic_dedup(
    x: np.ndarray,
    rank: np.ndarray,
    leaf: np.ndarray,
    threshold: float,
    max_leaf: int = 4096,
    probe: int = 3,
    margin: float = 0.1,
) -> SemanticDedupResult:
    """Semantic duplicates among n unit vectors ``x`` (n, d): the pairs of
    ``similar_pairs``, then the module's keep rule with ``rank`` (n,) keep priority (lower
    is kept first)."""
    pairs, sims, leaves = similar_pairs(x, leaf, threshold, max_leaf, probe, margin)
    keep, dup_of, similarity = keep_rule(len(x), np.asarray(rank), pairs, sims)
    return SemanticDedupResult(keep, dup_of, similarity, leaves)
