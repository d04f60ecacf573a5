"""Captions that arrive late: a captions run before the sidecars existed leaves the rows to
do (not done with nothing), and a re-ingest that changes a row's sidecars queues it again,
on a real warehouse through the CLI. Plus what ingest says it skipped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image
from typer.testing import CliRunner

from krea2 import curate
from krea2.curate import shapes
from krea2.curate.cli import app
from krea2.curate.plugins import PLAIN_CAPTION_FORMAT
from krea2.curate.stages import STAGES_BY_NAME


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _photos(root: Path, n: int) -> dict[str, str]:
    """``n`` distinct clean scenes as PNGs (no sidecars yet): file name → a caption for it."""
    root.mkdir()
    rng = np.random.default_rng(11)
    out = {}
    for i in range(n):
        scene = shapes.sample_scene(rng)
        Image.fromarray(shapes.render(scene, 320, 320)).save(root / f"p{i}.png")
        out[f"p{i}.png"] = shapes.captions(scene)["long"]
    return out


def _exported(shard_dir: Path) -> dict[str, list[dict]]:
    table = pq.read_table(sorted(shard_dir.glob("shard-*.parquet")))
    return {r["key"].split("/", 1)[1]: r["captions"] for r in table.to_pylist()}


def test_sidecars_added_after_a_captions_run_are_captioned_on_the_next(tmp_path, cluster_file):
    c = ("--cluster", str(cluster_file))
    root = tmp_path / "photos"
    captions = _photos(root, 4)
    _invoke("ingest", str(root), "--name", "photos", *c)
    ran = _invoke("run", "--stages", "analyze,dedup,ocr,captions", "--captioner", "sidecar", *c)
    assert "captions: 0 done, 4 failed" in ran  # nothing to caption: not done, failed
    assert "4 skipped, with nothing to caption until their inputs change" in ran
    wh = curate.open_warehouse(str(cluster_file))
    try:
        assert all(r["captions"] is None for r in curate.read_rows(wh, ["captions"]))
        # skipped: no work left for the stage until the rows' inputs change
        assert curate.skipped_rows(wh, STAGES_BY_NAME["captions"]) == 4
        assert curate.stage_progress(wh, ["captions"]) == {"captions": (0, 0)}
    finally:
        wh.close()
    shard_dir = tmp_path / "shards"
    out = _invoke("export", "--out", str(shard_dir), "--side", "64", *c)
    assert "4 kept images have no captions" in out and "no sidecar caption for" in out

    # the user adds the captions, both ways, and ingests the folder again
    for i, (name, text) in enumerate(captions.items()):
        if i % 2:
            (root / name).with_suffix(".txt").write_text(text)
        else:
            (root / name).with_suffix(".json").write_text(json.dumps({"caption": text}))
    again = _invoke("ingest", str(root), "--name", "photos", *c)
    assert "4 already ingested images have changed sidecars: their captions are queued" in again
    wh = curate.open_warehouse(str(cluster_file))
    try:  # work for the stage again
        assert curate.stage_progress(wh, ["captions"]) == {"captions": (0, 4)}
    finally:
        wh.close()
    assert "captions: 4 done, 0 failed" in _invoke(
        "run", "--stages", "captions", "--captioner", "sidecar", *c
    )  # at once: the failed rows' backoff was reset
    out = _invoke("export", "--out", str(shard_dir), "--side", "64", "--batch-size", "1", *c)
    assert "export: 4 rows" in out and "no captions" not in out
    plain = PLAIN_CAPTION_FORMAT  # the one format of a plain caption, .txt or .json
    assert _exported(shard_dir) == {n: [{"format": plain, "text": t}] for n, t in captions.items()}

    # a caption edited after it was written (a done row) is written again the same way
    (root / "p1.txt").write_text("an edited caption")
    assert "1 already ingested images" in _invoke("ingest", str(root), "--name", "photos", *c)
    assert "captions: 1 done" in _invoke(
        "run", "--stages", "captions", "--captioner", "sidecar", *c
    )
    _invoke("export", "--out", str(shard_dir), "--side", "64", "--batch-size", "1", *c)
    assert _exported(shard_dir)["p1.png"] == [{"format": plain, "text": "an edited caption"}]


def test_ingest_counts_what_it_skipped_and_names_it_when_verbose(tmp_path, cluster_file):
    root = tmp_path / "art"
    root.mkdir()
    for name in ("a.png", "b.jpg", "logo.svg", "icon.svg", "notes.md"):
        (root / name).write_bytes(b"x")
    (root / "logo.txt").write_text("the logo")  # the caption of an image that is skipped
    out = _invoke("ingest", str(root), "--cluster", str(cluster_file))
    assert "ingested 2 images" in out
    assert (
        "skipped 4 files: 2 .svg (unsupported image format: convert to PNG or JPEG), "
        "1 .md (not an image), 1 .txt (sidecar of a file not ingested)"
    ) in out
    assert "skipped logo.svg" not in out
    verbose = _invoke("ingest", str(root), "--verbose", "--cluster", str(cluster_file))
    for name in ("logo.svg", "icon.svg", "notes.md", "logo.txt"):
        assert f"skipped {name}: " in verbose
