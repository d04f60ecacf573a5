"""prepare_folder: a user's captioned images become shards through the warehouse's checks
(flat images and duplicates rejected by reason, uncaptioned images counted), bucketed."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from krea2.curate import shapes
from krea2.curate.plugins import PLAIN_CAPTION_FORMAT
from krea2.curate.prepare import prepare_folder
from krea2.infra.errors import UserError
from krea2.infra.shards import validate_shard_file


@pytest.fixture
def folder(tmp_path):
    """8 captioned ShapesWorld scenes (square and 3:4), an exact copy of the first, a flat
    grey image with a caption, and one scene without a caption."""
    rng = np.random.default_rng(0)
    root = tmp_path / "mine"
    root.mkdir()
    for i in range(9):
        scene = shapes.sample_scene(rng)
        w, h = (96, 128) if i % 2 else (96, 96)
        Image.fromarray(shapes.render(scene, w, h)).save(root / f"img{i}.png")
        if i < 8:
            (root / f"img{i}.txt").write_text(shapes.captions(scene)["long"] + "\n")
    shutil.copy(root / "img0.png", root / "copy.png")
    (root / "copy.txt").write_text("the same picture again")
    Image.new("RGB", (96, 96), (128, 128, 128)).save(root / "flat.png")
    (root / "flat.txt").write_text("grey")
    return root


def test_a_folder_becomes_checked_bucketed_shards(folder, tmp_path):
    result = prepare_folder(folder, tmp_path / "shards", side=64, min_side=64, batch_size=1)
    assert result.images == 11 and result.uncaptioned == 1
    assert result.rejected == {"entropy": 1, "exact_duplicate": 1}  # the flat grey, the copy
    assert result.rows == 8 and result.buckets == {"64x64": 4, "56x72": 4}
    files = sorted((tmp_path / "shards").glob("*.parquet"))
    assert len(files) == result.files
    for f in files:
        validate_shard_file(f)
    table = pq.read_table(files[0])
    first = table.to_pylist()[0]
    # a .txt caption is filed under the one plain-caption format, as curate ingest files it
    text = (folder / first["key"].split("/", 1)[1]).with_suffix(".txt").read_text().strip()
    assert first["captions"] == [{"format": PLAIN_CAPTION_FORMAT, "text": text}]


def test_a_folder_without_captions_says_what_to_add(tmp_path):
    (tmp_path / "x").mkdir()
    Image.new("RGB", (64, 64), (255, 0, 0)).save(tmp_path / "x" / "a.png")
    with pytest.raises(UserError, match=r"<image name>\.txt"):
        prepare_folder(tmp_path / "x", tmp_path / "out", side=64)


@pytest.mark.slow
def test_the_module_runs_as_a_command(folder, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "krea2.curate.prepare", str(folder), "--out",
         str(tmp_path / "s"), "--side", "64", "--min-side", "64", "--batch-size", "1"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "11 images: 8 rows" in out


def test_every_image_left_out_is_named_with_its_reason(folder, tmp_path):
    (folder / "logo.svg").write_text("<svg/>")
    out = tmp_path / "shards"
    result = prepare_folder(folder, out, side=64, min_side=64, batch_size=3)
    # 4 square and 4 tall scenes in batches of 3: one of each bucket does not fit
    assert result.rows == 6 and result.counts() == {
        "incomplete_batch": 2, "entropy": 1, "exact_duplicate": 1, "no_caption": 1, "skipped": 1,
    }  # fmt: skip
    summary = result.summary()
    assert "dropped to whole batches: 2" in summary and f"names in {out / 'dropped.tsv'}" in summary
    lines = (out / "dropped.tsv").read_text().splitlines()
    assert lines[0] == "image\treason\tdetail"
    named = {tuple(line.split("\t")) for line in lines[1:]}
    assert {
        ("img0.png", "exact_duplicate", "of copy.png"),  # copy.png: listed first
        ("flat.png", "entropy", ""),
        ("img8.png", "no_caption", ""),
        ("logo.svg", "skipped", "unsupported image format: convert to PNG or JPEG"),
    } <= named
    tails = [n for n in named if n[1] == "incomplete_batch"]
    assert len(tails) == 2 and all(n[2].startswith("batches of 3") for n in tails)
    written = {
        r["key"].split("/")[1] for r in pq.read_table(sorted(out.glob("*.parquet"))).to_pylist()
    }
    assert written.isdisjoint(n[0] for n in named) and len(written) + len(named) == 12
    # a second run into the same folder rewrites the list and leaves no stale shard
    again = prepare_folder(folder, out, side=64, min_side=64, batch_size=1)
    assert again.rows == 8 and again.counts()["skipped"] == 1
    assert again.folder == f"{out}: replaced the previous export there"
    assert "incomplete_batch" not in (out / "dropped.tsv").read_text()
    verbose = result.lines(verbose=True)
    assert "  dropped img0.png: exact_duplicate of copy.png" in verbose
    assert not any(line.startswith("  dropped") for line in result.lines())
