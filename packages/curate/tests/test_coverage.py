"""Concept coverage: full-text search over captions on every shard, rare-concept weights,
balanced sampling that keeps them, and an export that repeats them."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.coverage import read_concepts, repeats
from krea2.curate.shapes import Background, Scene, ShapeObject, encode, render
from krea2.infra.errors import UserError

# Six images: "red circle" in four, "blue square" in one, "green diamond" in one.
CAPTIONS = [
    "A red circle in the top left.",
    "A red circle on a black background.",
    "A red circle and a blue square.",
    "Two shapes: a red circle.",
    "A lone green diamond in the centre.",
    "Nothing but a yellow triangle.",
]


@pytest.fixture
def warehouse(cluster_file, tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    for i in range(len(CAPTIONS)):
        s = Scene((ShapeObject("circle", "red", i % 9, "large"),), Background("solid", "black"))
        (pool / f"{i}.png").write_bytes(encode(render(s, 64, 64), "png"))
    c = str(cluster_file)
    assert (
        CliRunner().invoke(app, ["ingest", str(pool), "--name", "p", "--cluster", c]).exit_code == 0
    )
    wh = curate.open_warehouse(c)
    patch = []
    for r in curate.read_rows(wh, ["uri"]):
        i = int(r["uri"].rsplit("/", 1)[-1].split(".")[0])
        caps = [{"format": "long", "text": CAPTIONS[i]}, {"format": "short", "text": "shapes"}]
        done = {"md5": f"m{i}", "text_reject": "", "cluster": f"0/{i % 2}"}
        patch.append({"image_key": r["image_key"], "captions": caps, **done})
    with wh.funnel() as f:
        f.patch(curate.TABLE, patch)
        f.flush()
    concepts = tmp_path / "concepts.tsv"
    concepts.write_text("Red circle\t0.5\nblue square\t0.2\ngreen diamond\nunicorn\n\n")
    yield wh, concepts
    wh.close()


def test_rare_concepts_are_found_weighted_kept_by_sampling_and_repeated_by_the_export(
    warehouse, tmp_path
):
    wh, concepts = warehouse
    cfg = curate.load_curate_config(
        overrides=[f"coverage.concepts={concepts}", "coverage.rare_rows=2", "balance.share=0.5"]
    )
    result = curate.run_stages(wh, ["coverage", "balance"], cfg)
    rows = {
        r["uri"].rsplit("/", 1)[-1]: r
        for r in curate.read_rows(wh, ["uri", "concepts_found", "sample_weight", "sample_keep"])
    }
    assert result["coverage"] == {
        "rows": 6, "concepts": 4, "present": 3, "rare": 2, "weighted_rows": 2,
    }  # fmt: skip
    assert rows["2.png"]["concepts_found"] == ["Red circle", "blue square"]  # phrase, any case
    assert rows["5.png"]["concepts_found"] == []
    assert [rows[f"{i}.png"]["sample_weight"] for i in range(6)] == [1, 1, 2, 1, 2, 1]
    # 3 of 6 rows: both rare-concept rows, then one drawn over the hierarchy.
    assert rows["2.png"]["sample_keep"] and rows["4.png"]["sample_keep"]
    assert sum(bool(r["sample_keep"]) for r in rows.values()) == 3
    cov = result["balance"]["coverage"]
    assert cov["rare_concepts"] == 2 and cov["rare_share_after"] == 1.0
    stats = curate.export_warehouse(wh, tmp_path / "shards", side=32, batch_size=1)
    assert stats.kept == 3
    import pyarrow.parquet as pq

    keys = [k for f in sorted((tmp_path / "shards").glob("*.parquet"))
            for k in pq.read_table(f, columns=["key"]).column("key").to_pylist()]  # fmt: skip
    assert len(keys) == 5 and sum("#r1" in k for k in keys) == 2  # each rare row twice


def test_repeats_are_the_whole_part_plus_a_seeded_fraction():
    r = repeats(np.full(10_000, 1.5), seed=0)
    assert set(r.tolist()) == {1, 2} and abs(r.mean() - 1.5) < 0.02
    assert (repeats(np.full(50, 1.5), 3) == repeats(np.full(50, 1.5), 3)).all()
    assert repeats(np.asarray([0.0, 1.0, 3.0]), 0).tolist() == [0, 1, 3]


def test_a_missing_concept_file_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no concept file"):
        read_concepts(tmp_path / "absent.txt")
