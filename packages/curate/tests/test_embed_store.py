"""The embedding store: float16 batches on disk, rows hold ``<file>.npy#<index>``."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.embed.store import read_vectors, split_ref, write_batch


def vectors(n: int, d: int = 8, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def test_vectors_come_back_in_any_order_from_several_batches(tmp_path):
    a, b = vectors(5, seed=1), vectors(3, seed=2)
    ra = write_batch(tmp_path, [f"a{i}" for i in range(5)], a)
    rb = write_batch(tmp_path, [f"b{i}" for i in range(3)], b)
    refs = [rb[2], ra[0], ra[4], rb[0]]
    got = read_vectors(refs, ["b2", "a0", "a4", "b0"])
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.stack([b[2], a[0], a[4], b[0]]))


def test_a_retried_batch_rewrites_the_same_file(tmp_path):
    keys = ["x", "y"]
    first = write_batch(tmp_path, keys, vectors(2))
    second = write_batch(tmp_path, keys, vectors(2))
    assert first == second
    assert len(list(tmp_path.rglob("*.npy"))) == 1
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_reference_to_another_rows_vector_is_refused(tmp_path):
    refs = write_batch(tmp_path, ["x", "y"], vectors(2))
    with pytest.raises(ValueError, match="holds row 'y', not 'x'"):
        read_vectors([refs[1]], ["x"])


def test_reading_into_a_memmap_bounds_memory(tmp_path):
    x = vectors(6)
    refs = write_batch(tmp_path / "store", [str(i) for i in range(6)], x)
    out = np.lib.format.open_memmap(tmp_path / "all.npy", "w+", np.float16, (6, 8))
    assert read_vectors(refs, out=out) is out
    np.testing.assert_array_equal(np.load(tmp_path / "all.npy"), x)


def test_malformed_references_name_the_expected_form():
    with pytest.raises(ValueError, match=r"not '<file>\.npy#<row>'"):
        split_ref("/x/y.npy")
    assert split_ref("/x/y.npy#12") == ("/x/y.npy", 12)
