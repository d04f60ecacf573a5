"""The curate jobs on a real krablet warehouse: same verdicts as in memory, crash-safe workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.shapes import make_pool, shapes_tagger, write_pool
from krea2.curate.sources import list_source
from krea2.curate.stages import COLUMNS
from krea2.infra import shards
from krea2.infra.pause import pause_env, wait_for_pause


def _pool_dir(tmp_path: Path, corrupt_corpus=None, **kw) -> Path:
    directory = tmp_path / "pool"
    write_pool(make_pool(seed=3, **kw), directory)
    for name, (data, _) in (corrupt_corpus or {}).items():
        (directory / f"zz-corrupt-{name}").write_bytes(data)
    return directory


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_warehouse_dag_gives_the_in_memory_verdicts(
    tmp_path, cluster_file, corrupt_corpus, ocr_engine
):
    directory = _pool_dir(tmp_path, corrupt_corpus, n_clean=16, n_per_defect=2, n_overrepresented=8)
    c = str(cluster_file)
    _invoke("ingest", str(directory), "--name", "pool", "--cluster", c)
    _invoke(
        "run",
        "--stages",
        "analyze,dedup,ocr,tags,concepts",
        "--tagger",
        "shapes",
        "--batch-size",
        "8",
        "--cluster",
        c,
    )
    wh = curate.open_warehouse(c)
    rows = {r["image_key"]: r for r in curate.read_rows(wh, list(COLUMNS))}
    wh.close()
    listed = list(list_source(directory, "pool"))
    assert sorted(rows) == sorted(r["image_key"] for r in listed)
    for name, (_, expected) in corrupt_corpus.items():
        row = rows[f"pool/zz-corrupt-{name}"]
        assert row["md5"] is not None, name
        if expected is not None:
            assert row["decode_error"] == expected, name
    keys = [r["image_key"] for r in listed]
    datas = [(directory / r["image_key"].split("/", 1)[1]).read_bytes() for r in listed]
    memory = curate.curate_in_memory(keys, datas, curate.CurateConfig(), ocr_engine, shapes_tagger)
    for v in memory:
        assert curate.final_reason(rows[v.key]) == v.reason, (v.key, rows[v.key]["reason"])
        if v.concept is not None:
            assert rows[v.key]["concept_over"] == v.concept.overrepresented, v.key
    assert any(r["concept_over"] for r in rows.values())


def test_report_and_export_from_the_warehouse(tmp_path, cluster_file):
    directory = _pool_dir(
        tmp_path,
        n_clean=24,
        n_per_defect=2,
        n_overrepresented=0,
        classes=("flat", "near_duplicate", "border"),
    )
    # One clean image without its sidecar: kept, but the captioner has no scene for it.
    labels = [json.loads(line) for line in (directory / "labels.jsonl").read_text().splitlines()]
    bare = next(m["file"] for m in labels if m["label"] == "clean")
    (directory / bare).with_suffix(".json").unlink()
    c = str(cluster_file)
    _invoke("ingest", str(directory), "--name", "pool", "--cluster", c)
    _invoke(
        "run", "--stages", "analyze,dedup,ocr,captions", "--captioner", "shapes", "--cluster", c
    )
    out = tmp_path / "report"
    _invoke(
        "report", "--out", str(out), "--labels", str(directory / "labels.jsonl"), "--cluster", c
    )
    summary = json.loads((out / "summary.json").read_text())
    page = (out / "index.html").read_text()
    assert "Duplicate groups" in page and "Score histograms" in page and "<img" in page
    assert summary["precision_recall"]["flat"]["recall"] == 1.0
    assert summary["precision_recall"]["near_duplicate"]["precision"] == 1.0
    assert summary["duplicate_groups"] >= 1
    shard_dir = tmp_path / "shards"
    output = _invoke(
        "export", "--out", str(shard_dir), "--side", "64", "--batch-size", "4", "--cluster", c
    )
    assert "1 kept images have no captions" in output and "--captioner" in output
    table = pq.read_table(sorted(shard_dir.glob("*.parquet"))[0])
    shards.validate_shard_table(table)
    exported = set(table.column("key").to_pylist())
    assert exported and all("clean" in k for k in exported)
    assert f"pool/{bare}" not in exported
    by_file = {m["file"]: m for m in labels}
    for row in table.select(["key", "captions", "meta"]).to_pylist():
        scene = curate.shapes.Scene.from_dict(by_file[row["key"].split("/", 1)[1]]["scene"])
        expected = [{"format": f, "text": t} for f, t in curate.shapes.captions(scene).items()]
        assert row["captions"] == expected
        assert curate.shapes.Scene.from_dict(json.loads(row["meta"])["scene"]) == scene


def test_unknown_stage_and_tagger_are_user_errors(cluster_file):
    result = CliRunner().invoke(app, ["run", "--stages", "analyse", "--cluster", str(cluster_file)])
    assert result.exit_code != 0 and "unknown stage" in str(result.exception)
    result = CliRunner().invoke(app, ["run", "--stage", "2048", "--cluster", str(cluster_file)])
    assert "stage '2048'" in str(result.exception)


def test_a_worker_killed_mid_batch_loses_nothing(tmp_path, cluster_file):
    directory = _pool_dir(tmp_path, n_clean=40, n_per_defect=0, n_overrepresented=0)
    c = str(cluster_file)
    _invoke("ingest", str(directory), "--name", "pool", "--cluster", c)
    total = len(list(directory.glob("*.jpg"))) + len(list(directory.glob("*.png")))
    krea2 = str(Path(sys.executable).parent / "krea2")
    cmd = [
        krea2,
        "curate",
        "run",
        "--stages",
        "analyze",
        "--batch-size",
        "4",
        "--lease-s",
        "2",
        "--cluster",
        c,
    ]
    notice = tmp_path / "paused"
    # the worker holds its second batch, claimed and leased, once the first is written
    env = os.environ | pause_env("krablet images.analyze", 1, notice)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True,
    )  # fmt: skip
    wait_for_pause(notice, proc, timeout_s=120)
    os.killpg(proc.pid, signal.SIGKILL)  # the worker and its decode children, mid-batch
    proc.wait()
    wh = curate.open_warehouse(c)
    done = wh.reader().count(curate.TABLE, [["md5", "is not", None]])
    assert 4 <= done < total, "the worker must die with work left"
    # no wait for its lease: the rerun (until empty) waits for the dead worker's rows itself
    _invoke("run", "--stages", "analyze", "--batch-size", "16", "--cluster", c)
    rows = curate.read_rows(wh, ["md5", "reject", "uri"])
    wh.close()
    assert len(rows) == total and all(r["md5"] for r in rows)
    assert all(r["reject"] is None for r in rows)  # every one a clean image
