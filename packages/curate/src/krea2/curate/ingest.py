"""Ingest sources: a directory tree, a URI list or a Parquet file → rows of the images table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from krea2.curate.storage import file_uri, parquet_uri
from krea2.infra.errors import UserError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff")
URI_COLUMNS = ("uri", "url", "path")
BYTES_COLUMNS = ("image", "bytes", "jpg", "png")


def _from_directory(root: Path, source: str, all_files: bool) -> Iterator[dict]:
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        if not all_files and path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        rel = path.relative_to(root).as_posix()
        yield {"image_key": f"{source}/{rel}", "uri": file_uri(path), "source": source}


def _from_uri_list(path: Path, source: str) -> Iterator[dict]:
    for n, line in enumerate(path.read_text().splitlines()):
        uri = line.strip()
        if uri and not uri.startswith("#"):
            if "://" not in uri:
                uri = file_uri((path.parent / uri) if not Path(uri).is_absolute() else Path(uri))
            yield {"image_key": f"{source}/{n:09d}", "uri": uri, "source": source}


def _from_parquet(path: Path, source: str) -> Iterator[dict]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
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
                }
            n += 1


def list_source(path: Path, source: str | None = None, all_files: bool = False) -> Iterator[dict]:
    """Rows ``{image_key, uri, source}`` for every image of ``path``: a directory (walked in
    sorted order, image suffixes only unless ``all_files``), a ``.parquet`` file with a
    uri/url/path column or an image bytes column (``parquet://`` URIs into the file, e.g. a
    Hugging Face image dataset), or a text file of URIs (one per line). Keys are ``source/<relative
    path>`` (directory) or ``source/<row number>``, so re-ingesting is idempotent."""
    if not path.exists():
        raise UserError(f"ingest source {path} does not exist")
    source = source or path.stem
    if path.is_dir():
        return _from_directory(path, source, all_files)
    if path.suffix == ".parquet":
        return _from_parquet(path, source)
    return _from_uri_list(path, source)
