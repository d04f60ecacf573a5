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
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import numpy as np

BYTES_PER_RECORD_IN_MEMORY = 24  # record + sorted copy + group bookkeeping
BYTES_PER_RECORD_WRITTEN = 40  # key, row, partition, order and record while routing
BYTES_PER_CANDIDATE = 40  # packed pair, unpacked rows, distance checks
KEY_BITS = 24  # band value bits inside a key; the band index sits above them
MAX_PARTITIONS = 4096


def flip_masks(bits: int, max_flips: int) -> np.ndarray:
    """All masks of ``bits`` bits with at most ``max_flips`` ones, as int64 (0 first)."""
    masks = [0]
    for k in range(1, max_flips + 1):
        masks += [sum(1 << i for i in c) for c in combinations(range(bits), k)]
    return np.asarray(masks, np.int64)


def band_values(phash: np.ndarray, bands: int) -> np.ndarray:
    """(n, nbytes) uint8 hashes → (n, bands) int64 band values (most significant bit first)."""
    bits = np.unpackbits(np.asarray(phash, np.uint8), axis=1)
    width = bits.shape[1] // bands
    weights = 1 << np.arange(width - 1, -1, -1, dtype=np.int64)
    return bits.reshape(len(bits), bands, width).astype(np.int64) @ weights


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


def write_partitions(
    phash: np.ndarray, bands: int, masks: np.ndarray, partitions: int, workdir: Path, rows: int
) -> list[Path]:
    """Route every (band key, row) record to its partition file; ``rows`` hashes at a time."""
    paths = [workdir / f"part-{p:05d}.u64" for p in range(partitions)]
    files = [p.open("ab") for p in paths]
    band = (np.arange(bands, dtype=np.int64) << KEY_BITS)[None, :, None]
    try:
        for start in range(0, len(phash), rows):
            values = band_values(phash[start : start + rows], bands)  # (m, bands)
            keys = (band | (values[:, :, None] ^ masks[None, None, :])).ravel()  # (m·bands·V,)
            ids = np.arange(start, start + len(values), dtype=np.uint64)
            ids = np.repeat(ids, bands * len(masks))
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


def candidate_pairs(records: np.ndarray, pair_batch: int) -> Iterator[np.ndarray]:
    """Rows sharing a key in one partition's (m,) uint64 records → batches of (k, 2) int64
    pairs i < j (a pair may repeat across batches and partitions)."""
    records = np.sort(records)
    keys = records >> np.uint64(32)
    ids = (records & np.uint64(0xFFFFFFFF)).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(keys)]
    group_end = np.repeat(ends, ends - starts)  # per position: end of its key's group
    later = group_end - np.arange(len(keys)) - 1  # partners after each position
    total = np.cumsum(later)
    first = 0
    while first < len(keys):
        # Positions [first, last) emit at most pair_batch pairs (at least one position).
        done = total[first - 1] if first else 0
        last = max(first + 1, int(np.searchsorted(total, done + pair_batch, "right")))
        count = later[first:last]
        if count.sum():
            pos = np.repeat(np.arange(first, last), count)
            offsets = np.arange(len(pos)) - np.repeat(np.cumsum(count) - count, count)
            a, b = ids[pos], ids[pos + 1 + offsets]
            yield np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)
        first = last


def partitioned_pairs(
    phash: np.ndarray,
    check,
    max_phash: int,
    bands: int,
    memory_bytes: int,
    workdir: str | Path | None = None,
) -> tuple[np.ndarray, int]:
    """Every pair within ``max_phash`` bits that ``check`` keeps, in ``memory_bytes``.

    ``phash`` (n, nbytes) uint8 (may be a memmap); ``check(pairs) -> pairs`` applies the full
    distance and vetoes to (k, 2) int64 pairs. Returns ((m, 2) int64 unique pairs i < j,
    the number of partitions used).
    """
    n, nbytes = phash.shape
    if n >= 1 << 32:
        raise ValueError(f"{n} images: rows must fit the 32 low bits of a record")
    width = nbytes * 8 // bands
    if nbytes * 8 % bands or width > KEY_BITS:
        raise ValueError(f"{nbytes * 8} phash bits do not split into {bands} bands ≤ 24 bits")
    masks = flip_masks(width, math.ceil((max_phash // bands) / 2))
    partitions = plan_partitions(n, bands, len(masks), memory_bytes)
    pair_batch = max(1024, memory_bytes // 2 // BYTES_PER_CANDIDATE)
    rows = max(1, memory_bytes // 2 // (BYTES_PER_RECORD_WRITTEN * bands * len(masks)))
    found = [np.zeros((0, 2), np.int64)]
    with tempfile.TemporaryDirectory(prefix="krea2-dedup-", dir=workdir) as tmp:
        for path in write_partitions(phash, bands, masks, partitions, Path(tmp), rows):
            if not path.stat().st_size:
                continue
            for batch in candidate_pairs(np.fromfile(path, np.uint64), pair_batch):
                packed = np.unique((batch[:, 0] << 32) | batch[:, 1])
                found.append(check(np.stack([packed >> 32, packed & 0xFFFFFFFF], axis=1)))
            path.unlink()  # free the disk as we go
    pairs = np.concatenate(found)
    packed = np.unique((pairs[:, 0] << 32) | pairs[:, 1])
    return np.stack([packed >> 32, packed & 0xFFFFFFFF], axis=1), partitions
