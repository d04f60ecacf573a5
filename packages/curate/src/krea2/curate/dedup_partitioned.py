"""Near-duplicate search that runs in a memory budget: band keys routed to partition files.

The phash is cut into ``bands`` bands of ``b`` bits. A pair within ``r`` bits differs in at
most ``f = ⌊r / bands⌋`` bits of some band (pigeonhole), and two band values within ``f``
bits meet on a common key when each side flips at most ``⌈f/2⌉`` of its own bits (split the
differing bits between them). So every image writes, per band, one record per key within
``⌈f/2⌉`` flips of its band value (1 + b keys for the default 18-bit bands and f = 2), and
every near-duplicate pair shares at least one key. Records are 8 bytes (key << 32 | row)
and go to one of ``K`` partition files by a hash of the key, so equal keys meet in one
partition; each partition is loaded alone, sorted, and the rows sharing a key are candidate
pairs, checked with the full distances and vetoes (``dedup.verified_pairs``). Only the
verified pairs (a few per duplicate) leave a partition.

Memory bound: a partition holds ``n · bands · keys_per_band / K`` records and is sorted into
a copy, so about 24 bytes per record (records, sorted copy, group bookkeeping); candidate
pairs are generated in batches of at most ``pair_batch`` (40 bytes each with their check).
``K`` is chosen so that both fit ``memory_bytes``. The hash arrays themselves are read by
row for the checks and may be ``np.memmap`` files (the page cache, not the process, holds
them). Disk: ``8 · bands · keys_per_band`` bytes per image (1,216 B at the defaults).

The crop ladder (``crop_ladder``) runs through the same search with ``views`` hashes per row
(its levels, any level of one image meeting any level of another), exact band keys
(``flips=0``), its empty levels writing no records (``skip_empty``), and ``max_group``: a key
shared by more rows than that is a stop key, skipped (true copies share many other keys). When
one partition suffices the records stay in memory and nothing is written.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import numpy as np
from numba import njit

BYTES_PER_RECORD_IN_MEMORY = 36  # record, sorted copy, group bookkeeping (measured ≤ 34)
BYTES_PER_RECORD_WRITTEN = 40  # key, row, partition, order and record while routing
BYTES_PER_CANDIDATE = 80  # positions, offsets, rows, packed pair and its sorted copy
KEY_BITS = 24  # band value bits inside a key; the band index sits above them
MAX_PARTITIONS = 4096


def flip_masks(bits: int, max_flips: int) -> np.ndarray:
    """All masks of ``bits`` bits with at most ``max_flips`` ones, as int64 (0 first)."""
    masks = [0]
    for k in range(1, max_flips + 1):
        masks += [sum(1 << i for i in c) for c in combinations(range(bits), k)]
    return np.asarray(masks, np.int64)


@njit(cache=True, nogil=True)
def _band_values(hashes: np.ndarray, bands: int) -> np.ndarray:
    n, width = hashes.shape[0], hashes.shape[1] * 8 // bands
    out = np.zeros((n, bands), np.int64)
    for r in range(n):
        for b in range(bands):
            v = 0
            for bit in range(b * width, (b + 1) * width):
                v = (v << 1) | ((hashes[r, bit >> 3] >> (7 - (bit & 7))) & 1)
            out[r, b] = v
    return out


def band_values(phash: np.ndarray, bands: int) -> np.ndarray:
    """(n, nbytes) uint8 hashes → (n, bands) int64 band values (most significant bit first)."""
    return _band_values(np.ascontiguousarray(phash, np.uint8), bands)


def _partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    # Fibonacci hashing spreads neighbouring keys (one bit flip apart) over partitions.
    mixed = (keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return (mixed % np.uint64(partitions)).astype(np.int64)


def plan_partitions(n: int, bands: int, keys_per_band: int, memory_bytes: int) -> int:
    """Partitions needed so that one partition's records fit half of ``memory_bytes``."""
    records = n * bands * keys_per_band
    need = math.ceil(records * BYTES_PER_RECORD_IN_MEMORY / max(1, memory_bytes // 2))
    if need > MAX_PARTITIONS:
        raise ValueError(
            f"{n} images need {need} partitions of {memory_bytes} bytes (at most "
            f"{MAX_PARTITIONS}); raise dedup.max_memory_mb"
        )
    return max(1, need)


def band_records(
    chunk: np.ndarray,
    start: int,
    bands: int,
    masks: np.ndarray,
    views: int = 1,
    skip_empty: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(m, views · nbytes) uint8 rows from row ``start`` → (keys, rows) int64/uint64: one per
    row, view, band and mask; with ``skip_empty``, views of all-zero bytes write none."""
    m = len(chunk)
    flat = np.asarray(chunk, np.uint8).reshape(m * views, -1)
    band = (np.arange(bands, dtype=np.int64) << KEY_BITS)[None, :, None]
    values = band_values(flat, bands)  # (m·views, bands)
    keys = band | (values[:, :, None] ^ masks[None, None, :])  # (m·views, bands, V)
    ids = np.repeat(np.arange(start, start + m, dtype=np.uint64), views)
    if skip_empty:
        present = flat.any(axis=1)
        keys, ids = keys[present], ids[present]
    return keys.ravel(), np.repeat(ids, bands * len(masks))


def write_partitions(
    phash: np.ndarray,
    bands: int,
    masks: np.ndarray,
    partitions: int,
    workdir: Path,
    rows: int,
    views: int = 1,
    skip_empty: bool = False,
) -> list[Path]:
    """Route every (band key, row) record to its partition file; ``rows`` hashes at a time."""
    paths = [workdir / f"part-{p:05d}.u64" for p in range(partitions)]
    files = [p.open("ab") for p in paths]
    try:
        for start in range(0, len(phash), rows):
            chunk = phash[start : start + rows]
            keys, ids = band_records(chunk, start, bands, masks, views, skip_empty)
            part = _partition_of(keys, partitions)
            order = np.argsort(part, kind="stable")
            bounds = np.searchsorted(part[order], np.arange(partitions + 1))
            records = ((keys.astype(np.uint64) << np.uint64(32)) | ids)[order]
            for p in np.flatnonzero(np.diff(bounds)):
                records[bounds[p] : bounds[p + 1]].tofile(files[p])
    finally:
        for f in files:
            f.close()
    return paths


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of a 1-D integer array by sorting (numpy 2.3's hash-based ``np.unique``
    takes ~100× longer on tens of millions of uint64)."""
    values = np.sort(values)
    return values[np.r_[True, values[1:] != values[:-1]]] if len(values) else values


def _group_ends(records: np.ndarray) -> np.ndarray:
    """End position of each run of equal keys (the high 32 bits) in sorted ``records``."""
    changes = np.flatnonzero((records[1:] >> np.uint64(32)) != (records[:-1] >> np.uint64(32)))
    return np.r_[changes + 1, len(records)] if len(records) else changes


def candidate_pairs(
    records: np.ndarray, pair_batch: int, max_group: int | None = None
) -> Iterator[np.ndarray]:
    """Rows sharing a key in one partition's (m,) uint64 records → batches of (k, 2) int64
    pairs i < j (a pair may repeat across batches and partitions). Repeated records count
    once; keys held by more than ``max_group`` rows are skipped. Peak memory ~30 B per
    record (the sort, then only the records of keys that at least two rows hold)."""
    records = sorted_unique(records)
    ends = _group_ends(records)
    sizes = np.diff(ends, prepend=0)
    keep = (sizes > 1) if max_group is None else (sizes > 1) & (sizes <= max_group)
    records = records[np.repeat(keep, sizes)]
    ends = np.cumsum(sizes[keep])
    sizes = sizes[keep]
    ids = (records & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    del records, keep
    later = np.repeat(ends, sizes)  # per position: end of its key's group, then
    later -= np.arange(1, len(ids) + 1)  # partners after each position
    total = np.cumsum(later)
    del later
    first = 0
    while first < len(ids):
        # Positions [first, last) emit at most pair_batch pairs (at least one position).
        done = total[first - 1] if first else 0
        last = max(first + 1, int(np.searchsorted(total, done + pair_batch, "right")))
        count = np.diff(total[first:last], prepend=done)
        if count.sum():
            pos = np.repeat(np.arange(first, last), count)
            offsets = np.arange(len(pos)) - np.repeat(np.cumsum(count) - count, count)
            a, b = ids[pos].astype(np.int64), ids[pos + 1 + offsets].astype(np.int64)
            yield np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)
        first = last


def partitioned_pairs(
    phash: np.ndarray,
    check,
    max_phash: int,
    bands: int,
    memory_bytes: int,
    workdir: str | Path | None = None,
    *,
    views: int = 1,
    flips: int | None = None,
    skip_empty: bool = False,
    max_group: int | None = None,
) -> tuple[np.ndarray, int]:
    """Every pair within ``max_phash`` bits that ``check`` keeps, in ``memory_bytes``.

    ``phash`` (n, views · nbytes) uint8 (may be a memmap); ``check(pairs) -> pairs`` applies
    the full distance and vetoes to (k, 2) int64 pairs. ``flips``: bits each side flips per
    band key (default: enough for every pair within ``max_phash``); ``views``, ``skip_empty``
    and ``max_group``: see the module docstring. Returns ((m, 2) int64 unique pairs i < j,
    the number of partitions used).
    """
    n, nbytes = phash.shape
    memory_bytes = int(memory_bytes)
    if n >= 1 << 32:
        raise ValueError(f"{n} images: rows must fit the 32 low bits of a record")
    bits = nbytes * 8 // views
    width = bits // bands
    if nbytes % views or bits % bands or width > KEY_BITS:
        raise ValueError(f"{bits} hash bits do not split into {bands} bands ≤ 24 bits")
    masks = flip_masks(width, math.ceil((max_phash // bands) / 2) if flips is None else flips)
    keys_per_row = views * bands
    partitions = plan_partitions(n, keys_per_row, len(masks), memory_bytes)
    pair_batch = max(1024, memory_bytes // 2 // BYTES_PER_CANDIDATE)
    # per row while routing: its unpacked bits and band values, then its records
    per_row = views * (bits + 16 * bands) + BYTES_PER_RECORD_WRITTEN * keys_per_row * len(masks)
    rows = max(1, memory_bytes // 2 // per_row)
    found = [np.zeros((0, 2), np.int64)]

    def search(records: np.ndarray) -> None:
        for batch in candidate_pairs(records, pair_batch, max_group):
            packed = sorted_unique((batch[:, 0] << 32) | batch[:, 1])
            found.append(check(np.stack([packed >> 32, packed & 0xFFFFFFFF], axis=1)))

    if partitions == 1:  # fits: the records stay in memory
        chunks = []
        for start in range(0, n, rows):
            chunk = phash[start : start + rows]
            keys, ids = band_records(chunk, start, bands, masks, views, skip_empty)
            chunks.append((keys.astype(np.uint64) << np.uint64(32)) | ids)
        search(np.concatenate(chunks))
    else:
        with tempfile.TemporaryDirectory(prefix="krea2-dedup-", dir=workdir) as tmp:
            paths = write_partitions(
                phash, bands, masks, partitions, Path(tmp), rows, views, skip_empty
            )
            for path in paths:
                if path.stat().st_size:
                    search(np.fromfile(path, np.uint64))
                path.unlink()  # free the disk as we go
    pairs = np.concatenate(found)
    packed = sorted_unique((pairs[:, 0] << 32) | pairs[:, 1])
    return np.stack([packed >> 32, packed & 0xFFFFFFFF], axis=1), partitions
