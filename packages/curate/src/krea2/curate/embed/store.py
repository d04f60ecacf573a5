"""Embeddings on disk: one float16 ``.npy`` per embedded batch, rows point at (file, index).

A batch of rows embedded together is written once, atomically (a temporary file renamed into
place), to ``<root>/<digest[:2]>/<digest>.npy`` where the digest is of the batch's keys, so
a batch retried after a crash rewrites the same file, and the ``images`` row stores
``<file>#<index>`` in its ``embedding`` column (the warehouse holds keys, the store the
vectors). Next to each array a ``.keys`` file lists the batch's row keys, so a reader can
check that a reference still points at its own row. Reading groups references by file and
memory-maps each file once, so memory is the rows asked for, not the files they sit in.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SUFFIX = ".npy"


def batch_digest(keys: Sequence[str]) -> str:
    """A stable name for the batch of row ``keys`` (order matters: it is the array's)."""
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_batch(root: Path, keys: Sequence[str], vectors: np.ndarray) -> list[str]:
    """Store (n, d) ``vectors`` of rows ``keys`` under ``root``; returns one reference
    (``/abs/path.npy#i``) per row, in order."""
    if len(keys) != len(vectors):
        raise ValueError(f"{len(keys)} keys for {len(vectors)} vectors")
    digest = batch_digest(keys)
    path = Path(root).resolve() / digest[:2] / f"{digest}{SUFFIX}"
    data = np.ascontiguousarray(vectors, np.float16)
    _atomic_write(path.with_suffix(".keys"), lambda f: f.write("\n".join(keys).encode()))
    _atomic_write(path, lambda f: np.save(f, data))
    return [f"{path}#{i}" for i in range(len(keys))]


def split_ref(ref: str) -> tuple[str, int]:
    """``/path/file.npy#i`` → (path, i); a ``ValueError`` names a malformed reference."""
    path, sep, index = ref.rpartition("#")
    if not sep or not path.endswith(SUFFIX) or not index.isdigit():
        raise ValueError(f"embedding reference {ref!r} is not '<file>.npy#<row>'")
    return path, int(index)


def read_vectors(
    refs: Sequence[str], keys: Sequence[str] | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """The (n, d) float16 vectors of ``refs``, in order. With ``keys``, each reference is
    checked to belong to its row (a ``ValueError`` names a mismatch). ``out``: an (n, d)
    array to fill, e.g. an ``np.memmap`` when n vectors do not fit in memory."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for pos, ref in enumerate(refs):
        path, index = split_ref(ref)
        by_file.setdefault(path, []).append((pos, index))
    for path, items in by_file.items():
        arr = np.load(path, mmap_mode="r")
        if out is None:
            out = np.empty((len(refs), arr.shape[1]), np.float16)
        pos, index = (np.asarray(v, np.int64) for v in zip(*items, strict=True))
        out[pos] = arr[index]
        if keys is not None:
            stored = Path(path).with_suffix(".keys").read_text().split("\n")
            for p, i in items:
                if stored[i] != keys[p]:
                    raise ValueError(f"{refs[p]} holds row {stored[i]!r}, not {keys[p]!r}")
    return out if out is not None else np.zeros((0, 0), np.float16)
