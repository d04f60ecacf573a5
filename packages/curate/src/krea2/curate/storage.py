"""Where image bytes live: URIs by scheme (``file://``, ``parquet://``; others register)."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from krea2.infra.errors import UserError

Reader = Callable[[str], bytes]
_READERS: dict[str, Reader] = {}


def register_reader(scheme: str, reader: Reader) -> None:
    """Make ``read_uri`` handle ``scheme://…`` with ``reader(uri) -> bytes`` (e.g. ``s3``)."""
    _READERS[scheme] = reader


def file_uri(path: Path) -> str:
    """``file://`` URI of an absolute path."""
    return path.resolve().as_uri()


def _read_file(uri: str) -> bytes:
    return Path(unquote(urlparse(uri).path)).read_bytes()


register_reader("file", _read_file)


def parquet_uri(path: Path, row: int, column: str) -> str:
    """URI of the bytes in ``column`` of row ``row`` (0-based, file order) of a Parquet file."""
    return f"parquet://{path.resolve().as_posix()}?row={row}&column={column}"


@functools.lru_cache(maxsize=4)
def _row_group(path: str, group: int, column: str) -> list:
    # Workers claim keys in order, so consecutive rows share a row group: cache a few.
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).read_row_group(group, columns=[column]).column(0).to_pylist()


@functools.lru_cache(maxsize=64)
def _row_group_starts(path: str) -> list[int]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    starts, n = [], 0
    for g in range(meta.num_row_groups):
        starts.append(n)
        n += meta.row_group(g).num_rows
    return [*starts, n]


def _read_parquet(uri: str) -> bytes:
    parsed = urlparse(uri)
    query = parse_qs(parsed.query)
    try:
        row, column = int(query["row"][0]), query["column"][0]
    except (KeyError, ValueError):
        raise UserError(f"parquet URI {uri!r} needs ?row=N&column=NAME") from None
    path = unquote(parsed.path)
    starts = _row_group_starts(path)
    if not 0 <= row < starts[-1]:
        raise UserError(f"row {row} is outside {path} ({starts[-1]} rows)")
    group = bisect.bisect_right(starts, row) - 1
    value = _row_group(path, group, column)[row - starts[group]]
    if isinstance(value, dict):  # an HF datasets Image feature: {"bytes": ..., "path": ...}
        value = value.get("bytes")
    if value is None:
        raise OSError(f"no bytes in {uri}")
    return bytes(value)


register_reader("parquet", _read_parquet)


def read_uri(uri: str) -> bytes:
    """The bytes behind ``uri``; a bare path counts as ``file://``. I/O errors propagate
    (a worker retries them later); an unknown scheme is a user error."""
    scheme = urlparse(uri).scheme
    if scheme in ("", "/") or (len(scheme) == 1 and uri[1:3] == ":\\"):
        return Path(uri).read_bytes()
    reader = _READERS.get(scheme)
    if reader is None:
        raise UserError(
            f"no reader for URI scheme {scheme!r} in {uri!r}; known schemes: {sorted(_READERS)} "
            "(register one with krea2.curate.storage.register_reader)"
        )
    return reader(uri)
