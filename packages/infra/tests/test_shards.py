"""The shard contract's writer and validators: what curate writes and the trainer trusts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from krea2.infra import shards  # noqa: E402


def row(key: str, width: int = 8, height: int = 4, **over) -> dict:
    base = {
        "key": key,
        "image": b"\x89PNG fake bytes",
        "uri": None,
        "crop": None,
        "width": width,
        "height": height,
        "bucket": f"{width}x{height}",
        "captions": [{"format": "short", "text": "a red circle"}],
        "meta": json.dumps({"source": "test"}),
    }
    return base | over


def test_write_shard_round_trips_rows_and_metadata(tmp_path: Path) -> None:
    path = shards.write_shard(
        [row("a"), row("b")],
        tmp_path / "s" / "shard-00000.parquet",
        stage="64",
        seed=3,
        batch_size=2,
    )
    table = pq.read_table(path)
    assert table.column("key").to_pylist() == ["a", "b"]
    meta = table.schema.metadata
    assert meta[shards.METADATA_STAGE] == b"64"
    assert meta[shards.METADATA_SEED] == b"3"
    assert meta[shards.METADATA_BATCH_SIZE] == b"2"
    shards.validate_shard_file(path)
    assert [p.name for p in path.parent.iterdir()] == ["shard-00000.parquet"]


def test_write_shard_rejects_a_bad_row_and_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "shard-00000.parquet"
    with pytest.raises(shards.ShardSchemaError, match="bucket '9x9' does not match"):
        shards.write_shard([row("a", bucket="9x9")], target, stage="s", seed=0, batch_size=1)
    with pytest.raises(shards.ShardSchemaError, match="caption format 'poem'"):
        bad = row("b", captions=[{"format": "poem", "text": "x"}])
        shards.write_shard([bad], target, stage="s", seed=0, batch_size=1)
    with pytest.raises(shards.ShardSchemaError, match="neither image bytes nor a uri"):
        shards.write_shard([row("c", image=None)], target, stage="s", seed=0, batch_size=1)
    assert list(tmp_path.iterdir()) == []


def test_validate_shard_file_names_the_file_and_the_problem(tmp_path: Path) -> None:
    torn = tmp_path / "torn.parquet"
    torn.write_bytes(b"PAR1 not really")
    with pytest.raises(shards.ShardSchemaError, match=r"torn\.parquet is not a readable"):
        shards.validate_shard_file(torn)

    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"key": ["a"]}), other)
    with pytest.raises(shards.ShardSchemaError, match=r"other\.parquet is missing column .image."):
        shards.validate_shard_file(other)

    no_meta = tmp_path / "no_meta.parquet"
    pq.write_table(pa.Table.from_pylist([row("a")], schema=shards.shard_arrow_schema()), no_meta)
    with pytest.raises(shards.ShardSchemaError, match=r"krea2\.stage"):
        shards.validate_shard_file(no_meta)
