"""Training shards: the contract, buckets, packing, determinism, and readers without our code."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from krea2.curate.export import (
    ExportStats,
    Sample,
    auto_batch_size,
    export_shards,
    nearest_bucket,
    stage_buckets,
)
from krea2.curate.shapes import captions, render, sample_scene
from krea2.curate.shapes.defects import encode
from krea2.infra import shards


def _samples(n: int = 40) -> list[Sample]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        scene = sample_scene(rng)
        w, h = [(96, 96), (128, 96), (96, 128), (160, 90)][i % 4]
        data = encode(render(scene, w, h), "png")
        out.append(Sample(f"pool/{i:04d}", data, captions(scene), meta={"scene": scene.to_dict()}))
    return out


def test_buckets_cover_both_orientations_at_about_the_stage_area():
    for side in (32, 64, 256, 512):
        for w, h in stage_buckets(side):
            assert 0.8 < w * h / side**2 < 1.2
            assert (h, w) in stage_buckets(side)
    assert nearest_bucket(1920, 1080, stage_buckets(256)) == (352, 192)
    assert nearest_bucket(100, 100, stage_buckets(32)) == (32, 32)


def test_shards_follow_the_contract_and_pack_single_bucket_batches(tmp_path):
    stats = export_shards(
        _samples(), tmp_path, stage="toy-64", side=64, batch_size=4, rows_per_file=8
    )
    files = sorted(tmp_path.glob("shard-*.parquet"))
    assert stats.files == len(files) >= 2 and stats.rows + stats.dropped_tail == 40
    keys = []
    for f in files:
        table = pq.read_table(f)
        shards.validate_shard_table(table)
        md = table.schema.metadata
        assert md[shards.METADATA_STAGE] == b"toy-64" and md[shards.METADATA_BATCH_SIZE] == b"4"
        buckets = table.column("bucket").to_pylist()
        for i in range(0, len(buckets), 4):
            assert len(set(buckets[i : i + 4])) == 1
        for row in table.select(["image", "width", "height"]).to_pylist():
            from io import BytesIO

            from PIL import Image

            assert Image.open(BytesIO(row["image"])).size == (row["width"], row["height"])
        keys += table.column("key").to_pylist()
    assert len(set(keys)) == len(keys) and all(k.startswith("pool/") for k in keys)


def test_export_is_deterministic_for_a_seed_and_shuffled_across_seeds(tmp_path):
    def order(seed: int, sub: str) -> list[str]:
        export_shards(_samples(), tmp_path / sub, stage="s", side=32, seed=seed, batch_size=4)
        return pq.read_table(tmp_path / sub / "shard-00000.parquet").column("key").to_pylist()

    a, b, c = order(1, "a"), order(1, "b"), order(2, "c")
    assert a == b and a != c
    assert a != sorted(a)
    # Bytes are identical too, so a sample behind a loss spike is found again exactly.
    ta = pq.read_table(tmp_path / "a" / "shard-00000.parquet")
    tb = pq.read_table(tmp_path / "b" / "shard-00000.parquet")
    assert ta.equals(tb)


def test_shards_are_readable_by_duckdb_and_hf_datasets(tmp_path):
    import duckdb
    from datasets import load_dataset

    export_shards(_samples(), tmp_path, stage="s", side=64, batch_size=4)
    glob = str(tmp_path / "shard-*.parquet")
    n, buckets = duckdb.sql(
        f"SELECT count(*), count(DISTINCT bucket) FROM read_parquet('{glob}')"
    ).fetchall()[0]
    assert n > 0 and buckets >= 2
    long = duckdb.sql(
        f"SELECT c.text FROM read_parquet('{glob}'), unnest(captions) AS t(c) "
        "WHERE c.format = 'long' LIMIT 1"
    ).fetchall()[0][0]
    assert long.startswith("The image shows")
    ds = load_dataset("parquet", data_files=glob, split="train")
    assert len(ds) == n and set(shards.COLUMNS) <= set(ds.column_names)


def test_bad_arguments_and_undecodable_samples(tmp_path):
    from krea2.infra.errors import UserError

    with pytest.raises(UserError, match="image format"):
        export_shards(_samples(4), tmp_path, stage="s", side=32, image_format="gif")
    bad = [*_samples(4), Sample("pool/bad", b"not an image", {"short": "x"})]
    stats = export_shards(bad, tmp_path, stage="s", side=32, batch_size=1)
    assert stats.failed == 1 and stats.rows == 4


def test_a_small_set_gets_a_batch_it_can_fill_by_default(tmp_path):
    # 16 images in one bucket: the old default of 32 wrote 0 rows and dropped all 16
    square = [s for i, s in enumerate(_samples(64)) if i % 4 == 0]  # 96x96: one bucket
    stats = export_shards(square, tmp_path / "b", "s", side=32)
    assert stats.batch_size == 16 and stats.rows == 16 and stats.shortfall() == []
    assert auto_batch_size([1000, 37, 5]) == 32
    assert auto_batch_size([10, 6]) == 4  # 8 would drop 8 of 16


def test_an_export_that_writes_fewer_rows_says_why_and_what_to_change(tmp_path):
    stats = export_shards(_samples(40), tmp_path, "s", side=64, batch_size=32)
    assert stats.rows == 0 and stats.dropped_tail == 40
    assert any("whole batches of 32" in s and "--batch-size" in s for s in stats.shortfall())
    assert "captions --captioner" in ExportStats(uncaptioned=3).shortfall()[0]
    assert "krea2 curate run" in ExportStats(kept=0).shortfall()[0]


def test_the_rows_an_export_leaves_out_are_named_with_their_reason(tmp_path):
    from krea2.curate.export import DROPPED_FILE, dropped_rows_file

    bad = [*_samples(6), Sample("pool/bad", b"not an image", {"short": "x"})]
    stats = export_shards(bad, tmp_path / "o", "s", side=32, batch_size=4,
                          side_files=dropped_rows_file)  # fmt: skip
    rows = (tmp_path / "o" / DROPPED_FILE).read_text().splitlines()
    assert rows[0] == "image_key\treason\tdetail"
    named = {line.split("\t")[0]: line.split("\t")[1] for line in rows[1:]}
    assert named.pop("pool/bad") == "undecodable"
    assert sorted(named) == sorted(stats.dropped_keys) and set(named.values()) == {
        "incomplete_batch"
    }
    assert len(named) == stats.dropped_tail > 0
    whole = export_shards(_samples(4), tmp_path / "w", "s", side=32, batch_size=1,
                          side_files=dropped_rows_file)  # fmt: skip
    assert whole.dropped_tail == 0 and not (tmp_path / "w" / DROPPED_FILE).exists()


def test_a_second_export_into_a_folder_replaces_the_first_and_foreign_files_are_refused(tmp_path):
    from krea2.curate.export_folder import MANIFEST
    from krea2.infra.errors import UserError

    out = tmp_path / "shards"
    first = export_shards(_samples(40), out, "s", side=32, batch_size=4, rows_per_file=8)
    assert first.files == 4 and first.folder == f"{out}: a new folder"
    (out / ".shard-00003.parquet.999.tmp").write_bytes(b"half")  # a write killed earlier
    second = export_shards(_samples(8), out, "s", side=32, batch_size=2, rows_per_file=8)
    # the trainer globs *.parquet: only the second export's rows are left to read
    assert sorted(p.name for p in out.glob("*.parquet")) == ["shard-00000.parquet"]
    table = pq.read_table(sorted(out.glob("*.parquet")))
    assert table.num_rows == second.rows == 8
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "shard-00000.parquet"]
    assert second.folder == (
        f"{out}: replaced the previous export there (3 of its files no longer written were removed)"
    )
    (out / "mine.parquet").write_bytes(b"someone else's")
    with pytest.raises(UserError, match=r"holds files no krea2 export wrote there \(mine\.parquet"):
        export_shards(_samples(4), out, "s", side=32, batch_size=4)
    assert (out / "mine.parquet").read_bytes() == b"someone else's"  # untouched
    old = tmp_path / "before-manifests"  # shards of an export that kept no manifest
    old.mkdir()
    (old / "shard-00000.parquet").write_bytes(b"old")
    with pytest.raises(UserError, match=r"choose a new or empty folder, or remove them"):
        export_shards(_samples(4), old, "s", side=32, batch_size=4)
