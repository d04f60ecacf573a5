"""Dedup: multi-index hashing finds every pair within the radius, groups, and the keep rule."""

from __future__ import annotations

import numpy as np

from krea2.curate.dedup import dedup, exact_duplicate_pairs, near_duplicate_pairs


def _brute_force(phash, colorhash, phash8, r, rc, r8):
    bits = np.unpackbits(phash, axis=1).astype(int)
    cbits = np.unpackbits(colorhash, axis=1).astype(int)
    bits8 = np.unpackbits(phash8, axis=1).astype(int)
    out = set()
    for i in range(len(phash)):
        d = (bits[i] != bits).sum(1)
        dc = (cbits[i] != cbits).sum(1)
        d8 = (bits8[i] != bits8).sum(1)
        for j in np.nonzero((d <= r) & (dc <= rc) & (d8 <= r8))[0]:
            if j > i:
                out.add((i, int(j)))
    return out


def _perturbed(rng, base, n_bits):
    out = base.copy()
    bits = np.unpackbits(out)
    flip = rng.choice(bits.size, n_bits, replace=False)
    bits[flip] ^= 1
    return np.packbits(bits)


def test_multi_index_hashing_finds_exactly_the_pairs_within_the_radius():
    rng = np.random.default_rng(0)
    n = 300
    phash = rng.integers(0, 256, (n, 18), dtype=np.uint8)
    for i in range(0, 120, 2):  # plant pairs at distances 0..28, straddling the radius
        phash[i + 1] = _perturbed(rng, phash[i], int(rng.integers(0, 29)))
    colorhash = np.zeros((n, 6), np.uint8)
    phash8 = np.zeros((n, 8), np.uint8)
    found = {tuple(p) for p in near_duplicate_pairs(phash, colorhash, phash8, 20, 6, 10).tolist()}
    assert found == _brute_force(phash, colorhash, phash8, 20, 6, 10)
    assert len(found) > 30


def test_colour_and_coarse_hash_veto_a_pair():
    phash = np.zeros((3, 18), np.uint8)
    colorhash = np.array([[0] * 6, [0] * 6, [255] * 6], np.uint8)
    phash8 = np.array([[0] * 8, [255] * 8, [0] * 8], np.uint8)
    assert near_duplicate_pairs(phash, colorhash, phash8).tolist() == []


def test_exact_duplicates_pair_with_the_first_copy():
    assert exact_duplicate_pairs(["a", "b", "a", "a"]).tolist() == [[0, 2], [0, 3]]


def test_groups_are_connected_components_and_keep_largest_then_earliest():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, (2, 18), dtype=np.uint8)
    # Chain 0 ~ 1 ~ 2 (0 and 2 are 16 bits apart, too far directly) and a separate pair 3 ~ 4.
    p1 = _perturbed(rng, base[0], 8)
    p2 = _perturbed(rng, p1, 8)
    phash = np.stack([base[0], p1, p2, base[1], base[1]])
    colorhash = np.zeros((5, 6), np.uint8)
    phash8 = np.zeros((5, 8), np.uint8)
    md5s = ["m0", "m1", "m2", "m3", "m3"]
    areas = np.array([100, 400, 400, 50, 50])
    r = dedup(md5s, phash, colorhash, phash8, areas, max_phash=10)
    assert r.group[0] == r.group[1] == r.group[2] != r.group[3] == r.group[4]
    # Largest wins (1 and 2 tie at 400 → earliest, 1); among equals the earliest (3).
    assert r.keep.tolist() == [False, True, False, True, False]
    assert r.kind.tolist() == ["near_duplicate", "", "near_duplicate", "", "exact_duplicate"]
    assert r.groups() == [[1, 0, 2], [3, 4]]


def test_dedup_of_nothing_and_of_one():
    empty = np.zeros((0, 18), np.uint8)
    assert (
        len(near_duplicate_pairs(empty, np.zeros((0, 6), np.uint8), np.zeros((0, 8), np.uint8)))
        == 0
    )
    one = dedup(
        ["a"],
        np.zeros((1, 18), np.uint8),
        np.zeros((1, 6), np.uint8),
        np.zeros((1, 8), np.uint8),
        np.array([1]),
    )
    assert one.keep.tolist() == [True]
