"""Ingest sources: a directory tree, a URI list or a Parquet file → rows of the images table.

Per-image metadata and captions travel with a directory's images as sidecar files
(``<stem>.json``, ``<stem>.txt``; ``krea2.curate.sidecars``): they become the row's
``meta`` and are never ingested as images. Every other file a directory listing leaves out
is recorded with why (``Skipped``): an image format curate does not decode (SVG, HEIC, ...)
or not an image at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from krea2.curate.sidecars import SIDECAR_SUFFIXES, read_sidecars
from krea2.curate.storage import file_uri, parquet_uri
from krea2.infra.errors import UserError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff")
# Image formats met in real folders that the decoder does not read (vector art, phone and
# camera formats, layered files): named as such, so a user converts them rather than
# wondering where they went.
UNDECODED_IMAGE_SUFFIXES = (
    ".svg", ".svgz", ".heic", ".heif", ".avif", ".jxl", ".psd", ".eps", ".ico", ".raw",
    ".cr2", ".nef", ".arw", ".dng",
)  # fmt: skip
URI_COLUMNS = ("uri", "url", "path")
BYTES_COLUMNS = ("image", "bytes", "jpg", "png")

UNSUPPORTED = "unsupported image format: convert to PNG or JPEG"
NOT_AN_IMAGE = "not an image"
NO_IMAGE = "sidecar of a file not ingested"


@dataclass
class Skipped:
    """Files a directory listing left out: (path relative to the root, reason)."""

    files: list[tuple[str, str]] = field(default_factory=list)

    def add(self, rel: str, reason: str) -> None:
        self.files.append((rel, reason))

    def counts(self) -> dict[tuple[str, str], int]:
        """Skipped files by (suffix, reason), most first, then by suffix."""
        c = Counter((Path(rel).suffix.lower() or "(no suffix)", why) for rel, why in self.files)
        return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self) -> str:
        """One line: ``skipped 9 files: 7 .svg (unsupported image format: ...), 2 .md (not
        an image)``; empty when nothing was skipped."""
        if not self.files:
            return ""
        parts = [f"{n} {suffix} ({why})" for (suffix, why), n in self.counts().items()]
        return f"skipped {len(self.files)} files: " + ", ".join(parts)


def _from_directory(
    root: Path, source: str, all_files: bool, skipped: Skipped | None
) -> Iterator[dict]:
    paths = [p for p in sorted(root.rglob("*")) if p.is_file()]

    def taken(p: Path) -> bool:  # ingested as an image (every file but sidecars: all_files)
        image = p.suffix.lower() in IMAGE_SUFFIXES
        return image or (all_files and p.suffix not in SIDECAR_SUFFIXES)

    stems = {p.with_suffix("") for p in paths if taken(p)}
    others = {p.with_suffix("") for p in paths if p.suffix not in SIDECAR_SUFFIXES} - stems
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if path.suffix in SIDECAR_SUFFIXES and path.with_suffix("") in stems:
            continue  # read with its image
        if not taken(path) and not all_files:
            if skipped is not None:
                suffix = path.suffix.lower()
                why = UNSUPPORTED if suffix in UNDECODED_IMAGE_SUFFIXES else NOT_AN_IMAGE
                if path.suffix in SIDECAR_SUFFIXES and path.with_suffix("") in others:
                    why = NO_IMAGE  # e.g. logo.txt beside logo.svg
                skipped.add(rel, why)
            continue
        yield {
            "image_key": f"{source}/{rel}",
            "uri": file_uri(path),
            "source": source,
            "meta": read_sidecars(path) if taken(path) else None,
        }


def _from_uri_list(path: Path, source: str) -> Iterator[dict]:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise UserError(
            f"{path} is not a text file of URIs (one per line); ingest takes a directory, "
            "a .parquet file or a URI list"
        ) from None
    for n, line in enumerate(text.splitlines()):
        uri = line.strip()
        if uri and not uri.startswith("#"):
            if "://" not in uri:
                uri = file_uri((path.parent / uri) if not Path(uri).is_absolute() else Path(uri))
            yield {"image_key": f"{source}/{n:09d}", "uri": uri, "source": source, "meta": None}


def _from_parquet(path: Path, source: str) -> Iterator[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(
            f"{path} is not a readable Parquet file ({e}); re-export or re-download it"
        ) from None
    names = pf.schema_arrow.names
    col = next((c for c in URI_COLUMNS if c in names), None)
    if col is None:
        data_col = next((c for c in BYTES_COLUMNS if c in names), None)
        if data_col is None:
            raise UserError(
                f"{path} has no URI column {URI_COLUMNS} and no image bytes column "
                f"{BYTES_COLUMNS}; found {names}"
            )
        # The bytes stay in the Parquet file; rows point into it.
        yield from (
            {
                "image_key": f"{source}/{n:09d}",
                "uri": parquet_uri(path, n, data_col),
                "source": source,
                "meta": None,
            }
            for n in range(pf.metadata.num_rows)
        )
        return
    keys = "key" if "key" in names else None
    n = 0
    for batch in pf.iter_batches(columns=[col] + ([keys] if keys else [])):
        uris = batch.column(col).to_pylist()
        ids = batch.column(keys).to_pylist() if keys else [None] * len(uris)
        for uri, key in zip(uris, ids, strict=True):
            if uri:
                k = f"{source}/{key}" if key is not None else f"{source}/{n:09d}"
                yield {
                    "image_key": k,
                    "uri": uri if "://" in uri else file_uri(Path(uri)),
                    "source": source,
                    "meta": None,
                }
            n += 1


def list_source(
    path: Path, source: str | None = None, all_files: bool = False, skipped: Skipped | None = None
) -> Iterator[dict]:
    """Rows ``{image_key, uri, source, meta}`` for every image of ``path``: a directory (walked in
    sorted order, image suffixes only unless ``all_files``; the other files are added to
    ``skipped``), a ``.parquet`` file with a
    uri/url/path column or an image bytes column (``parquet://`` URIs into the file, e.g. a
    Hugging Face image dataset), or a text file of URIs (one per line). ``meta``: a
    directory image's sidecars (see the module docstring), else None. Keys are ``source/<relative
    path>`` (directory) or ``source/<row number>``, so re-ingesting is idempotent."""
    if not path.exists():
        raise UserError(f"ingest source {path} does not exist")
    source = source or path.stem
    if path.is_dir():
        return _from_directory(path, source, all_files, skipped)
    if path.suffix == ".parquet":
        return _from_parquet(path, source)
    return _from_uri_list(path, source)
