"""Near-duplicate dedup: multi-index hashing over phash bands, connected components, one keeper.

A pair is a duplicate when the md5s are equal, or when the 144-bit phash distance is at most
``max_phash``, the 64-bit phash at most ``max_phash8`` *and* the colorhash distance at most
``max_color`` (phash alone ignores colour and confuses flat images; the coarse 8×8 phash
vetoes pairs whose fine structure agrees only by chance), and, when saturated-hue histograms
are given, their total-variation distance is at most ``max_hue`` (colorhash is too coarse to
tell a recoloured small object apart; see ``hashes.hue_histogram``). Candidates come from a FAISS
``IndexBinaryMultiHash``: the phash is cut into ``bands`` bands and every hash within
``⌊max_phash / bands⌋`` flips of a query band is probed, so by pigeonhole no pair within
``max_phash`` is missed and nothing is all-pairs. The index holds the 18-byte hashes plus
its buckets in memory (measured 252 bytes per image: 16M images per 4 GiB). When that does
not fit ``max_memory_mb``, ``dedup_partitioned`` finds the same pairs from band keys routed to
partition files, each loaded alone within the budget; either way the verified pairs (small)
form the graph whose connected components are the groups.

A second way to be a pair catches what the global phash misses: centred crops keeping ≥ 85%
of each side, overlays (watermarks, logos, captions up to ~3% of the frame) and both at once.
When crop ladders are given (``crop_ladder``: hashes of ten nested centred crops per image),
candidates are the pairs sharing an exact band (24 bits at the default 6 bands) of any level
of each (≤ 60 keys per image, through ``dedup_partitioned``: in memory, or in partitions past
the budget), and a candidate is a duplicate when its ladder distance (three levels of one
scale, ``crop_ladder.ladder_distances``) is within ``max_ladder`` of 144 bits and the
colorhash and hue vetoes pass (the 8×8 phash veto reads the whole frame, which a crop or an
overlay changes, so it does not apply here). Hashes of flat synthetic scenes (a background
and one shape) agree by layout alone, so a ladder pair that the phash rule and md5s do not
already join is then verified on its pixels: ``copy_verify.copy_score`` of both images'
band-passed centre thumbnails (``copy_verify.LADDER_VIEW``) must reach ``ladder_verify``.
Either way makes a pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from krea2.curate.config import DedupConfig
from krea2.curate.copy_verify import LADDER_VIEW, PixelReader, verify_read
from krea2.curate.crop_ladder import LEVELS, ladder_distances
from krea2.curate.dedup_partitioned import partitioned_pairs, sorted_unique
from krea2.curate.hashes import hue_distance

IN_MEMORY_BYTES_PER_IMAGE = 252  # IndexBinaryMultiHash, 144 bits, 8 bands (1M random hashes)
UNBOUNDED = 1 << 62  # bytes: "as much memory as it takes"


@dataclass(frozen=True)
class DedupResult:
    """For n images: ``group`` (n,) int component id; ``keep`` (n,) bool, one True per group;
    ``kind`` (n,) str: ``""`` for keepers, else ``exact_duplicate`` or ``near_duplicate``;
    ``pairs`` (m, 2) int64 duplicate edges i < j; ``ladder_checked``/``ladder_kept``: the
    crop-ladder pairs verified on their pixels and those that passed."""

    group: np.ndarray
    keep: np.ndarray
    kind: np.ndarray
    pairs: np.ndarray
    ladder_checked: int = 0
    ladder_kept: int = 0

    def groups(self) -> list[list[int]]:
        """Groups with more than one member, each sorted with its keeper first."""
        out: dict[int, list[int]] = {}
        for i, g in enumerate(self.group):
            out.setdefault(int(g), []).append(i)
        return [sorted(m, key=lambda i: (not self.keep[i], i)) for m in out.values() if len(m) > 1]


def _popcount(x: np.ndarray) -> np.ndarray:
    return np.unpackbits(x, axis=1).sum(axis=1)


def verified_pairs(
    pairs: np.ndarray,
    phash: np.ndarray,
    colorhash: np.ndarray,
    phash8: np.ndarray,
    max_phash: int,
    max_color: int,
    max_phash8: int,
    hue: np.ndarray | None = None,
    max_hue: float = 0.3,
) -> np.ndarray:
    """The (k, 2) candidate pairs whose phash12, colorhash, phash8 (and hue) distances are all
    within their limits. Rows are gathered per pair, so the arrays may be memmaps."""
    if not len(pairs):
        return pairs
    a, b = pairs[:, 0], pairs[:, 1]
    ok = (_popcount(phash[a] ^ phash[b]) <= max_phash) & (
        _popcount(phash8[a] ^ phash8[b]) <= max_phash8
    )
    return pairs[ok & colour_vetoes_pass(pairs, colorhash, max_color, hue, max_hue)]


def colour_vetoes_pass(
    pairs: np.ndarray,
    colorhash: np.ndarray,
    max_color: int,
    hue: np.ndarray | None = None,
    max_hue: float = 0.3,
) -> np.ndarray:
    """(k,) bool: the pairs whose colorhash (and hue) distances are within their limits."""
    a, b = pairs[:, 0], pairs[:, 1]
    ok = _popcount(colorhash[a] ^ colorhash[b]) <= max_color
    if hue is not None:
        ok &= hue_distance(hue[a], hue[b]) <= max_hue
    return ok


def ladder_pairs(
    ladder: np.ndarray,
    colorhash: np.ndarray,
    max_ladder: int = 20,
    max_color: int = 6,
    hue: np.ndarray | None = None,
    max_hue: float = 0.3,
    bands: int = 6,
    max_group: int | None = 10_000,
    memory_bytes: int = UNBOUNDED,
    workdir: str | None = None,
) -> np.ndarray:
    """Duplicate edges by crop ladder: ``ladder`` (n, LADDER_BYTES) uint8 (all-zero rows: no
    ladder, never paired) → (m, 2) int64 pairs i < j (see the module docstring)."""
    if len(ladder) < 2:
        return np.zeros((0, 2), np.int64)

    def check(pairs: np.ndarray) -> np.ndarray:
        if not len(pairs):
            return pairs
        ok = ladder_distances(ladder, pairs, limit=max_ladder) <= max_ladder
        ok[ok] = colour_vetoes_pass(pairs[ok], colorhash, max_color, hue, max_hue)
        return pairs[ok]

    return partitioned_pairs(
        ladder, check, max_ladder, bands, memory_bytes, workdir,
        views=LEVELS, flips=0, skip_empty=True, max_group=max_group,
    )[0]  # fmt: skip


def near_duplicate_pairs(
    phash: np.ndarray,
    colorhash: np.ndarray,
    phash8: np.ndarray,
    max_phash: int = 20,
    max_color: int = 6,
    max_phash8: int = 10,
    bands: int = 8,
    chunk: int = 65536,
    hue: np.ndarray | None = None,
    max_hue: float = 0.3,
    max_memory_mb: float | None = None,
    workdir: str | None = None,
) -> np.ndarray:
    """Duplicate edges among n images. ``phash`` (n, 18) uint8 (12×12), ``colorhash`` (n, 6)
    uint8, ``phash8`` (n, 8) uint8, ``hue`` (n, 19) uint8 or None → (m, 2) int64 pairs i < j.

    With ``max_memory_mb`` set and an in-memory index that would not fit it, the search runs
    over partition files in ``workdir`` (default: the system temp dir) instead; the pairs are
    the same."""
    n, nbytes = phash.shape
    d = nbytes * 8
    if d % bands:
        raise ValueError(f"{d} phash bits do not split into {bands} equal bands")
    if n < 2:
        return np.zeros((0, 2), np.int64)
    limits = (max_phash, max_color, max_phash8)
    if max_memory_mb is not None and n * IN_MEMORY_BYTES_PER_IMAGE > max_memory_mb * 2**20:

        def check(pairs: np.ndarray) -> np.ndarray:
            return verified_pairs(pairs, phash, colorhash, phash8, *limits, hue, max_hue)

        budget = int(max_memory_mb * 2**20)
        return partitioned_pairs(phash, check, max_phash, bands, budget, workdir)[0]
    index = faiss.IndexBinaryMultiHash(d, bands, d // bands)
    index.nflip = max_phash // bands
    index.add(np.ascontiguousarray(phash))
    found = []
    for start in range(0, n, chunk):
        q = np.ascontiguousarray(phash[start : start + chunk])
        lims, _, ids = index.range_search(q, max_phash + 1)  # faiss keeps distance < radius
        rows = np.repeat(np.arange(start, start + len(q)), np.diff(lims).astype(np.int64))
        keep = ids > rows  # each pair once, no self-pairs
        found.append(np.stack([rows[keep], ids[keep]], axis=1))
    pairs = np.concatenate(found).astype(np.int64)
    return verified_pairs(pairs, phash, colorhash, phash8, *limits, hue, max_hue)


def _components(n: int, pairs: np.ndarray) -> np.ndarray:
    """(n,) connected-component id of each of n rows under the (m, 2) ``pairs``."""
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def exact_duplicate_pairs(md5s: list[str]) -> np.ndarray:
    """Edges from each repeated md5 to its first occurrence → (m, 2) int64."""
    first: dict[str, int] = {}
    pairs = []
    for i, h in enumerate(md5s):
        if h in first:
            pairs.append((first[h], i))
        else:
            first[h] = i
    return np.asarray(pairs, np.int64).reshape(-1, 2)


def dedup(
    md5s: list[str],
    phash: np.ndarray,
    colorhash: np.ndarray,
    phash8: np.ndarray,
    areas: np.ndarray,
    max_phash: int = 20,
    max_color: int = 6,
    max_phash8: int = 10,
    bands: int = 8,
    hue: np.ndarray | None = None,
    max_hue: float = 0.3,
    max_memory_mb: float | None = None,
    workdir: str | None = None,
    ladder: np.ndarray | None = None,
    max_ladder: int = 20,
    ladder_bands: int = 6,
    ladder_max_group: int | None = 10_000,
    ladder_verify: float = DedupConfig.ladder_verify,
    read: PixelReader | None = None,
) -> DedupResult:
    """Group exact and near duplicates into connected components and keep one per group:
    the largest (``areas``, pixels of the original), then the earliest (lowest index, i.e.
    ingest order). ``max_memory_mb``/``workdir``: see ``near_duplicate_pairs``; ``ladder``
    (n, LADDER_BYTES) uint8 or None and its settings: see ``ladder_pairs``; ladder pairs are
    verified on the pixels ``read`` gives (``copy_verify.verify_read``) when
    ``ladder_verify`` > 0."""
    n = len(md5s)
    if ladder is not None and ladder_verify > 0 and read is None:
        raise ValueError(
            "crop-ladder pairs are verified on pixels (dedup.ladder_verify > 0): pass read= "
            "(row index -> decoded pixels), or set dedup.ladder_verify=0 to trust the ladder"
        )
    exact = exact_duplicate_pairs(md5s)
    checked = kept = 0
    near = near_duplicate_pairs(
        phash,
        colorhash,
        phash8,
        max_phash,
        max_color,
        max_phash8,
        bands,
        hue=hue,
        max_hue=max_hue,
        max_memory_mb=max_memory_mb,
        workdir=workdir,
    )
    if ladder is not None:
        budget = UNBOUNDED if max_memory_mb is None else int(max_memory_mb * 2**20)
        cropped = ladder_pairs(
            ladder, colorhash, max_ladder, max_color, hue, max_hue, ladder_bands,
            ladder_max_group, budget, workdir,
        )  # fmt: skip
        if ladder_verify > 0 and len(cropped):
            # Only a pair that joins two groups (of the md5s, the phash rule and the ladder
            # pairs verified so far) changes the result: verify those alone.
            joined = _components(n, np.concatenate([exact, near]))
            assert read is not None  # checked above
            ok, scores = verify_read(cropped, read, ladder_verify, LADDER_VIEW, joined)
            checked, kept = int((~np.isnan(scores)).sum()), int(ok.sum())
            cropped = cropped[ok]
        both = np.concatenate([near, cropped])  # a pair both ways find counts once
        packed = sorted_unique((both[:, 0] << 32) | both[:, 1])
        near = np.stack([packed >> 32, packed & 0xFFFFFFFF], axis=1)
    pairs = np.concatenate([exact, near]) if len(near) else exact
    group = _components(n, pairs)
    # Sort by (group, −area, index): the first of each group is its keeper.
    order = np.lexsort((np.arange(n), -np.asarray(areas, np.int64), group))
    keep = np.zeros(n, bool)
    first = np.ones(n, bool)
    first[1:] = group[order[1:]] != group[order[:-1]]
    keep[order[first]] = True
    keeper_of = np.empty(n, np.int64)
    keeper_of[group[order[first]]] = order[first]
    kind = np.full(n, "", dtype=object)
    for i in np.nonzero(~keep)[0]:
        same = md5s[i] == md5s[keeper_of[group[i]]]
        kind[i] = "exact_duplicate" if same else "near_duplicate"
    return DedupResult(group, keep, kind, pairs, checked, kept)


def dedup_configured(
    md5s: list[str],
    phash: np.ndarray,
    colorhash: np.ndarray,
    phash8: np.ndarray,
    areas: np.ndarray,
    hue: np.ndarray | None,
    d: DedupConfig,
    ladder: np.ndarray | None = None,
    read: PixelReader | None = None,
) -> DedupResult:
    """``dedup`` with the thresholds, bands and memory budget of a ``DedupConfig``; ``read``:
    the pixels that verify ladder pairs (see ``dedup``)."""
    return dedup(
        md5s,
        phash,
        colorhash,
        phash8,
        areas,
        d.phash12_max_distance,
        d.colorhash_max_distance,
        d.phash8_max_distance,
        d.bands,
        hue=hue,
        max_hue=d.hue_max_distance,
        max_memory_mb=d.max_memory_mb,
        workdir=d.spill_dir or None,
        ladder=ladder if d.ladder_max_distance > 0 else None,
        max_ladder=d.ladder_max_distance,
        ladder_bands=d.ladder_bands,
        ladder_max_group=d.ladder_max_bucket or None,
        ladder_verify=d.ladder_verify,
        read=read,
    )
