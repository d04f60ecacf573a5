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
    assert first["captions"][0]["format"] == "long" and first["captions"][0]["text"]


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
