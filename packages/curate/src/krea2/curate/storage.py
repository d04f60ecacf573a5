"""Where image bytes live: URIs by scheme (``file://`` now; object stores register a reader)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

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
