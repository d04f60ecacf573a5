"""Work-folder results written whole or not at all: a stage killed mid-write leaves no
half file that a rerun would take for finished work.

Each writer writes a temporary sibling (``.NAME.tmp``) and renames it over the target, so
the target either holds the complete result or does not exist. :func:`cached` is the
pattern every resumable stage uses: read the result if it is there, else make and write it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["cached", "cached_array", "publish_dir", "write_json", "write_with"]

T = TypeVar("T")


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def write_with(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, then rename it to ``path``
    (a file or a folder; an existing one is replaced). Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    if tmp.is_dir():
        shutil.rmtree(tmp)
    write(tmp)
    if path.is_dir() and tmp.is_dir():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def write_json(path: str | Path, data: Any) -> Path:
    """``data`` as indented JSON at ``path``, atomically."""
    return write_with(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1)))


def publish_dir(path: str | Path, fill: Callable[[Path], Any]) -> Path:
    """A folder made by ``fill(tmp)`` in a temporary sibling, then renamed to ``path``;
    an existing ``path`` is kept as it is (it was published whole)."""
    path = Path(path)
    if path.is_dir():
        return path
    return write_with(path, lambda tmp: (tmp.mkdir(parents=True), fill(tmp)))


def cached(path: str | Path, make: Callable[[], T], read: Callable[[Path], T],
           write: Callable[[Path, T], Any]) -> T:  # fmt: skip
    """``read(path)`` when ``path`` exists; else ``make()``, written with ``write(tmp,
    value)`` and renamed to ``path`` atomically, then returned."""
    path = Path(path)
    if path.exists():
        return read(path)
    value = make()
    write_with(path, lambda tmp: write(tmp, value))
    return value


def cached_array(path: str | Path, make: Callable[[], Any]) -> Any:
    """A numpy array kept at ``path`` (``.npy``): loaded when there, else made and saved."""
    import numpy as np

    def save(tmp: Path, value: Any) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save would append .npy to the name
            np.save(f, value)

    return cached(path, make, np.load, save)
