"""The partitioned (out-of-core) near-duplicate search gives the in-memory path's pairs and
groups, within a memory budget small enough to force many partitions."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.config import DedupConfig
from krea2.curate.dedup import dedup_configured, near_duplicate_pairs, verified_pairs
from krea2.curate.dedup_partitioned import (
    candidate_pairs,
    flip_masks,
    partitioned_pairs,
    plan_partitions,
)
from krea2.curate.image_analysis import analyze_bytes
from krea2.curate.shapes.defects import make_pool


def _planted(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random hashes with pairs planted at phash distances 0..28 (straddling the radius 20)
    and colour/phash8 codes that veto some of them."""
    rng = np.random.default_rng(seed)
    phash = rng.integers(0, 256, (n, 18), dtype=np.uint8)
    bits = np.unpackbits(phash, axis=1)
    for i in range(0, 160, 2):
        j = i + 1
        bits[j] = bits[i]
        bits[j, rng.choice(144, int(rng.integers(0, 29)), replace=False)] ^= 1
    phash = np.packbits(bits, axis=1)
    colorhash = (rng.random((n, 6)) < 0.02).astype(np.uint8) * 255  # rare colour vetoes
    phash8 = np.zeros((n, 8), np.uint8)
    return phash, colorhash, phash8


def _as_set(pairs: np.ndarray) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in pairs}


@pytest.mark.parametrize("seed", [0, 1])
def test_partitioned_search_finds_exactly_the_in_memory_pairs(seed):
    phash, colorhash, phash8 = _planted(seed)

    def check(pairs):
        return verified_pairs(pairs, phash, colorhash, phash8, 20, 6, 10)

    budget = 256 * 1024  # bytes: forces a dozen partitions for 400 images
    pairs, partitions = partitioned_pairs(phash, check, 20, 8, budget)
    assert partitions >= 8
    expected = near_duplicate_pairs(phash, colorhash, phash8, 20, 6, 10)
    assert _as_set(pairs) == _as_set(expected)
    assert len(expected) > 30 and len(pairs) == len(_as_set(pairs))  # unique, non-trivial


def test_dedup_groups_are_the_same_on_a_shapes_pool(tmp_path):
    dups = ("exact_duplicate", "near_duplicate")
    pool = make_pool(seed=3, n_clean=60, n_per_defect=12, n_overrepresented=0, classes=dups)
    analyses = [analyze_bytes(it.data) for it in pool]
    alive = [a for a in analyses if a.reject is None]

    def stack(col: str) -> np.ndarray:
        return np.stack([np.frombuffer(a.hashes[col], np.uint8) for a in alive])

    args = (
        [a.md5 for a in alive],
        stack("phash12"),
        stack("colorhash"),
        stack("phash8"),
        np.asarray([a.width * a.height for a in alive]),
        stack("huehist"),
    )
    in_memory = dedup_configured(*args, DedupConfig(max_memory_mb=1024))
    # 0.02 MiB < 252 B × n: the partitioned path, with tens of partitions.
    small = DedupConfig(max_memory_mb=0.02, spill_dir=str(tmp_path))
    partitioned = dedup_configured(*args, small)
    assert in_memory.groups() == partitioned.groups() and len(in_memory.groups()) >= 8
    assert (in_memory.keep == partitioned.keep).all()
    assert (in_memory.kind == partitioned.kind).all()
    assert list(tmp_path.iterdir()) == []  # partition files are removed


def test_candidate_batches_emit_every_pair_of_a_group_once():
    ids = np.arange(50, dtype=np.uint64)
    records = np.concatenate([(np.uint64(7) << np.uint64(32)) | ids, [np.uint64(9) << 32]])
    batches = list(candidate_pairs(records, pair_batch=100))  # 1,225 pairs in batches
    pairs = np.concatenate(batches)
    assert len(batches) > 5 and max(len(b) for b in batches) <= 100 + 49
    assert _as_set(pairs) == {(i, j) for i in range(50) for j in range(i + 1, 50)}
    assert len(pairs) == 1225


def test_keys_within_one_flip_and_the_partition_plan():
    masks = flip_masks(18, 1)
    assert len(masks) == 19 and masks[0] == 0 and len(set(masks.tolist())) == 19
    assert plan_partitions(1000, 8, 19, 2**30) == 1
    with pytest.raises(ValueError, match=r"raise dedup\.max_memory_mb"):
        plan_partitions(10**9, 8, 19, 2**20)
