"""The training-shard contract between ``curate`` (writer) and ``trainer`` (reader).

One Parquet row per sample (docs/architecture.md, contract 2):

==========  ==========================  ==============================================
column      type                        meaning
==========  ==========================  ==============================================
key         string                      warehouse primary key, to trace a sample back
image       binary (nullable)           encoded image, already cropped+resized to bucket
uri         string (nullable)           or: where the original bytes live ...
crop        list<int32>[4] (nullable)   ... and the crop box (left, top, right, bottom)
width       int32                       pixels of the bucket (after crop and resize)
height      int32                       pixels
bucket      string                      ``"{width}x{height}"``, e.g. ``"512x768"``
captions    list<struct<format, text>>  formats from :data:`CAPTION_FORMATS`
meta        string                      JSON object (scores, source, scene spec, ...)
reference   binary (optional column)    a second encoded image of an image-conditioned
                                        stage (e.g. a style reference of the same style)
==========  ==========================  ==============================================

File-level metadata (Parquet key/value) records ``krea2.stage`` (the resolution stage
name), ``krea2.seed`` and ``krea2.batch_size`` (rows of one bucket are packed in runs of
this many, so a batch never mixes buckets). pyarrow is imported lazily so that this
module stays importable without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CAPTION_FORMATS: tuple[str, ...] = ("long", "medium", "short", "tags", "json")
COLUMNS: tuple[str, ...] = (
    "key",
    "image",
    "uri",
    "crop",
    "width",
    "height",
    "bucket",
    "captions",
    "meta",
)
METADATA_STAGE = b"krea2.stage"
METADATA_SEED = b"krea2.seed"
METADATA_BATCH_SIZE = b"krea2.batch_size"


class ShardSchemaError(ValueError):
    """A table does not follow the training-shard contract."""


def shard_arrow_schema(reference: bool = False) -> Any:
    """The pyarrow schema of a training shard (see the module docstring); ``reference``
    adds the optional ``reference`` image column."""
    import pyarrow as pa

    caption = pa.struct([("format", pa.string()), ("text", pa.string())])
    return pa.schema(
        [
            pa.field("key", pa.string(), nullable=False),
            pa.field("image", pa.binary()),
            pa.field("uri", pa.string()),
            pa.field("crop", pa.list_(pa.int32(), 4)),
            pa.field("width", pa.int32(), nullable=False),
            pa.field("height", pa.int32(), nullable=False),
            pa.field("bucket", pa.string(), nullable=False),
            pa.field("captions", pa.list_(caption), nullable=False),
            pa.field("meta", pa.string()),
        ]
        + ([pa.field("reference", pa.binary())] if reference else [])
    )


def __getattr__(name: str) -> Any:
    if name == "SHARD_SCHEMA":  # lazily, so importing this module does not import pyarrow
        return shard_arrow_schema()
    raise AttributeError(name)


def bucket_name(width: int, height: int) -> str:
    return f"{width}x{height}"


def parse_bucket(bucket: str) -> tuple[int, int]:
    """``"512x768"`` → ``(512, 768)`` (width, height)."""
    try:
        w, h = bucket.lower().split("x")
        return int(w), int(h)
    except ValueError:
        raise ShardSchemaError(f"bucket {bucket!r} is not of the form '<width>x<height>'") from None


def validate_shard_schema(schema: Any, where: str = "shard") -> None:
    """Raise :class:`ShardSchemaError` if a pyarrow ``schema`` lacks a contract column or
    has one of another type; ``where`` names the file in the message."""
    expected = shard_arrow_schema()
    missing = [f.name for f in expected if f.name not in schema.names]
    if missing:
        raise ShardSchemaError(
            f"{where} is missing column {missing[0]!r}; the contract's columns are {COLUMNS}"
        )
    for field in expected:
        actual = schema.field(field.name).type
        if not actual.equals(field.type):
            raise ShardSchemaError(
                f"{where}: column {field.name!r} has type {actual}, expected {field.type}"
            )


def validate_shard_file(path: Path) -> None:
    """Check a Parquet file's schema and stage metadata without reading its rows (what a
    reader does before trusting a file); :class:`ShardSchemaError` names the file."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, ValueError) as e:  # pyarrow raises ArrowInvalid (a ValueError) if torn
        raise ShardSchemaError(f"{path} is not a readable Parquet file: {e}") from None
    validate_shard_schema(schema, where=str(path))
    metadata = schema.metadata or {}
    for key in (METADATA_STAGE, METADATA_BATCH_SIZE):
        if key not in metadata:
            raise ShardSchemaError(f"{path} lacks the {key.decode()!r} file metadata")


def validate_shard_table(table: Any) -> None:
    """Raise :class:`ShardSchemaError` naming the first violation of the contract.

    Checks column names and types, that every row has image bytes or a uri, that
    ``bucket`` matches ``width``/``height``, that caption formats are known, and that
    ``meta`` is a JSON object.
    """
    validate_shard_schema(table.schema)
    rows = table.select(["key", "image", "uri", "width", "height", "bucket", "captions", "meta"])
    for row in rows.to_pylist():
        key = row["key"]
        if row["image"] is None and row["uri"] is None:
            raise ShardSchemaError(f"row {key!r} has neither image bytes nor a uri")
        if parse_bucket(row["bucket"]) != (row["width"], row["height"]):
            raise ShardSchemaError(
                f"row {key!r}: bucket {row['bucket']!r} does not match "
                f"{row['width']}x{row['height']}"
            )
        for caption in row["captions"]:
            if caption["format"] not in CAPTION_FORMATS:
                raise ShardSchemaError(
                    f"row {key!r}: caption format {caption['format']!r} "
                    f"is not one of {CAPTION_FORMATS}"
                )
        if row["meta"] is not None:
            try:
                meta = json.loads(row["meta"])
            except json.JSONDecodeError:
                raise ShardSchemaError(f"row {key!r}: meta is not valid JSON") from None
            if not isinstance(meta, dict):
                raise ShardSchemaError(f"row {key!r}: meta must be a JSON object")


def write_shard(
    rows: Sequence[dict[str, Any]],
    path: Path,
    *,
    stage: str,
    seed: int,
    batch_size: int,
    row_group_size: int | None = None,
) -> Path:
    """Validate ``rows`` (dicts with the contract's columns, and ``reference`` when any
    row has one) and write them as one shard.

    The file records ``stage``, ``seed`` and ``batch_size`` as metadata. It is written to
    a hidden temporary file in the same directory and renamed into place, so a reader never
    sees half a shard and a crash leaves no file at ``path``. Returns ``path``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if batch_size < 1:
        raise ShardSchemaError(f"batch_size must be >= 1, got {batch_size}")
    reference = any("reference" in row for row in rows)
    schema = shard_arrow_schema(reference).with_metadata(
        {
            METADATA_STAGE: stage.encode(),
            METADATA_SEED: str(seed).encode(),
            METADATA_BATCH_SIZE: str(batch_size).encode(),
        }
    )
    try:
        table = pa.Table.from_pylist(list(rows), schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as e:
        raise ShardSchemaError(f"rows for {path} do not fit the shard schema: {e}") from None
    validate_shard_table(table)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp, row_group_size=row_group_size or max(batch_size * 16, 64))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
