"""Ingest sources: a directory tree, a URI list or a Parquet file → rows of the images table.

Per-image metadata travels with a directory's images the webdataset / img2dataset way: a
sidecar ``<stem>.json`` next to ``<stem>.<ext>`` (a JSON object: alt text, source URL, a
ShapesWorld scene spec, ...) becomes the row's ``meta``; sidecars are never ingested as
images.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from krea2.curate.storage import file_uri, parquet_uri
from krea2.infra.errors import UserError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff")
URI_COLUMNS = ("uri", "url", "path")
BYTES_COLUMNS = ("image", "bytes", "jpg", "png")


SIDECAR_SUFFIX = ".json"


def sidecar_path(image: Path) -> Path:
    """Where the metadata of ``image`` lives: ``<stem>.json`` beside it."""
    return image.with_suffix(SIDECAR_SUFFIX)


def read_sidecar(image: Path) -> dict | None:
    """The JSON object in ``image``'s sidecar, None if there is none; a sidecar that is not
    a JSON object, or whose captions (``sidecar_captions``) are malformed, is a user error
    naming the file."""
    path = sidecar_path(image)
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"sidecar {path} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(meta, dict):
        raise UserError(f"sidecar {path} must hold a JSON object, not {type(meta).__name__}")
    try:
        sidecar_captions(meta, f"sidecar {path}")
    except ValueError as e:
        raise UserError(str(e)) from None
    return meta


def sidecar_captions(meta: dict | None, where: str = "sidecar") -> dict[str, str]:
    """The captions a sidecar carries: ``"captions"`` (``{format: text}``, a list of
    ``{format, text}`` or a string) or ``"caption"`` (a string, filed as the
    ``plugins.PLAIN_CAPTION_FORMAT`` caption); ``{}`` when it has none. A ``ValueError``
    names ``where`` for anything else."""
    from krea2.curate.plugins import captions_from

    meta = meta or {}
    return captions_from(meta.get("captions", meta.get("caption")), where)


def sidecar_captioner(uri: str, meta: dict | None) -> dict[str, str]:
    """The ``sidecar`` captioner: the captions of the image's sidecar (its row's ``meta``)."""
    return sidecar_captions(meta, f"metadata of {uri}")


def _from_directory(root: Path, source: str, all_files: bool) -> Iterator[dict]:
    paths = [p for p in sorted(root.rglob("*")) if p.is_file()]
    stems = {p.with_suffix("") for p in paths if p.suffix != SIDECAR_SUFFIX}
    for path in paths:
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            sidecar = path.suffix == SIDECAR_SUFFIX and path.with_suffix("") in stems
            if not all_files or sidecar:
                continue
        rel = path.relative_to(root).as_posix()
        yield {
            "image_key": f"{source}/{rel}",
            "uri": file_uri(path),
            "source": source,
            "meta": read_sidecar(path) if path.suffix != SIDECAR_SUFFIX else None,
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


def list_source(path: Path, source: str | None = None, all_files: bool = False) -> Iterator[dict]:
    """Rows ``{image_key, uri, source, meta}`` for every image of ``path``: a directory (walked in
    sorted order, image suffixes only unless ``all_files``), a ``.parquet`` file with a
    uri/url/path column or an image bytes column (``parquet://`` URIs into the file, e.g. a
    Hugging Face image dataset), or a text file of URIs (one per line). ``meta``: a
    directory image's sidecar (see the module docstring), else None. Keys are ``source/<relative
    path>`` (directory) or ``source/<row number>``, so re-ingesting is idempotent."""
    if not path.exists():
        raise UserError(f"ingest source {path} does not exist")
    source = source or path.stem
    if path.is_dir():
        return _from_directory(path, source, all_files)
    if path.suffix == ".parquet":
        return _from_parquet(path, source)
    return _from_uri_list(path, source)
