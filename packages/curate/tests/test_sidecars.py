"""The one caption convention of a folder of images: ``<stem>.txt`` or a caption in
``<stem>.json``, read by the same function for ``krea2 curate ingest`` and ``krea2 train
prepare``, filed under one caption format, and checked (errors name the file)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from krea2.curate import shapes
from krea2.curate.plugins import PLAIN_CAPTION_FORMAT
from krea2.curate.prepare import prepare_folder
from krea2.curate.sidecars import sidecar_captions
from krea2.curate.sources import list_source
from krea2.infra.errors import UserError


def _scenes(root, names):
    """A distinct ShapesWorld scene per name, saved as ``<name>.png`` (kept by every filter)."""
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    for name in names:
        Image.fromarray(shapes.render(shapes.sample_scene(rng), 96, 96)).save(root / f"{name}.png")


def test_ingest_and_prepare_read_txt_and_json_captions_alike(tmp_path):
    root = tmp_path / "mine"
    _scenes(root, ["a", "b", "c", "d"])
    (root / "a.txt").write_text("a cat on a mat\n")
    (root / "b.json").write_text('{"caption": "a dog", "url": "https://x/b.png"}')
    (root / "c.json").write_text('{"captions": {"long": "a long one", "short": "short"}}')
    (root / "d.txt").write_text("a bird")  # the .txt caption, the .json metadata
    (root / "d.json").write_text('{"url": "https://x/d.png", "captioner": "a person"}')
    expected = {
        "a.png": {PLAIN_CAPTION_FORMAT: "a cat on a mat"},
        "b.png": {PLAIN_CAPTION_FORMAT: "a dog"},
        "c.png": {"long": "a long one", "short": "short"},
        "d.png": {PLAIN_CAPTION_FORMAT: "a bird"},
    }
    ingested = {r["image_key"]: r["meta"] for r in list_source(root, "mine")}
    assert {k.split("/")[1]: sidecar_captions(m) for k, m in ingested.items()} == expected
    assert ingested["mine/d.png"]["url"] == "https://x/d.png"  # metadata stays metadata
    result = prepare_folder(root, tmp_path / "shards", side=64, min_side=64, batch_size=1)
    assert result.uncaptioned == 0 and result.rows == 4
    table = pq.read_table(sorted((tmp_path / "shards").glob("shard-*.parquet"))).to_pylist()
    shards = {
        r["key"].split("/")[1]: {c["format"]: c["text"] for c in r["captions"]} for r in table
    }
    assert shards == expected
    meta = {r["key"].split("/")[1]: json.loads(r["meta"]) for r in table}
    assert meta["b.png"]["url"] == "https://x/b.png" and meta["b.png"]["source"] == "mine"


def test_a_txt_and_a_json_caption_that_differ_are_an_error_naming_both(tmp_path):
    root = tmp_path / "mine"
    _scenes(root, ["a"])
    (root / "a.txt").write_text("a cat")
    (root / "a.json").write_text('{"caption": "a dog"}')
    for read in (
        lambda: list(list_source(root, "mine")),
        lambda: prepare_folder(root, tmp_path / "out", side=64, min_side=64),
    ):
        with pytest.raises(UserError, match=r"two captions: .*a\.txt says 'a cat', .*a\.json"):
            read()
    (root / "a.json").write_text('{"caption": "a cat", "url": "u"}')  # the same text twice
    (meta,) = [r["meta"] for r in list_source(root, "mine")]
    assert sidecar_captions(meta) == {PLAIN_CAPTION_FORMAT: "a cat"} and meta["url"] == "u"


@pytest.mark.parametrize(
    ("sidecar", "complaint"),
    [
        ('{"caption": ""}', r"'caption' is empty"),
        ('{"caption": "   "}', r"'caption' is empty"),
        ('{"caption": null}', r"'caption' is empty"),
        ('{"captions": {}}', r"'captions' is empty"),
        ('{"captions": {"long": ""}}', r"caption 'long': '' is not valid"),
        ('{"captoin": "a cat"}', r"key 'captoin' looks like a misspelt 'caption'"),
        ('{"Caption": "a cat"}', r"key 'Caption' looks like a misspelt 'caption'"),
        ('{"captons": {"long": "a cat"}}', r"key 'captons' looks like a misspelt 'caption"),
        ('{"caption": "a", "captions": {"long": "b"}}', r"has both 'caption' and 'captions'"),
    ],
)
def test_an_empty_or_misspelt_caption_is_an_error_naming_the_file(tmp_path, sidecar, complaint):
    root = tmp_path / "mine"
    _scenes(root, ["a"])
    (root / "a.json").write_text(sidecar)
    with pytest.raises(UserError, match=rf"sidecar .*mine/a\.json: {complaint}"):
        list(list_source(root, "mine"))
    with pytest.raises(UserError, match=rf"sidecar .*mine/a\.json: {complaint}"):
        prepare_folder(root, tmp_path / "out", side=64, min_side=64)


def test_an_empty_txt_caption_is_an_error_and_other_metadata_keys_are_free(tmp_path):
    root = tmp_path / "mine"
    _scenes(root, ["a", "b"])
    (root / "a.txt").write_text("\n")
    with pytest.raises(UserError, match=r"caption file .*mine/a\.txt is empty"):
        list(list_source(root, "mine"))
    (root / "a.txt").unlink()
    free = {"url": "u", "alt": "x", "captioner": "blip", "caption_source": "alt", "scene": {}}
    (root / "b.json").write_text(json.dumps(free))
    rows = {r["image_key"]: r["meta"] for r in list_source(root, "mine")}
    assert rows["mine/b.png"] == free and sidecar_captions(free) == {}
