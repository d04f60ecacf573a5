"""Ingest listing (directory, URI list, Parquet) and URI reading."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from krea2.curate.sources import list_source
from krea2.curate.storage import file_uri, read_uri, register_reader
from krea2.infra.errors import UserError


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/x.jpg", "a/b/y.PNG", "z.gif", "notes.txt"):
        (tmp_path / name).write_bytes(name.encode())
    return tmp_path


def test_directory_listing_is_sorted_keyed_by_relative_path_and_image_only(tree):
    rows = list(list_source(tree, "src"))
    assert [r["image_key"] for r in rows] == ["src/a/b/y.PNG", "src/a/x.jpg", "src/z.gif"]
    assert all(r["source"] == "src" and r["uri"].startswith("file://") for r in rows)
    assert read_uri(rows[1]["uri"]) == b"a/x.jpg"
    assert len(list(list_source(tree, "src", all_files=True))) == 4


def test_uri_list_and_parquet_sources(tree, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text(f"# comment\n{file_uri(tree / 'z.gif')}\na/x.jpg\n\n")
    rows = list(list_source(listing, "l"))
    assert [read_uri(r["uri"]) for r in rows] == [b"z.gif", b"a/x.jpg"]
    table = pa.table({"key": ["k1", "k2"], "path": [str(tree / "z.gif"), str(tree / "a/x.jpg")]})
    pq.write_table(table, tmp_path / "src.parquet")
    rows = list(list_source(tmp_path / "src.parquet", "pq"))
    assert [r["image_key"] for r in rows] == ["pq/k1", "pq/k2"]
    assert read_uri(rows[1]["uri"]) == b"a/x.jpg"


def test_bad_sources_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        list_source(tmp_path / "missing", "x")
    pq.write_table(pa.table({"name": ["a"]}), tmp_path / "bad.parquet")
    with pytest.raises(UserError, match="no URI column"):
        list(list_source(tmp_path / "bad.parquet", "x"))
    with pytest.raises(UserError, match="no reader for URI scheme 'gs'"):
        read_uri("gs://bucket/key.jpg")


def test_registered_schemes_are_read_through_their_reader():
    register_reader("mem", lambda uri: uri.encode())
    assert read_uri("mem://abc") == b"mem://abc"


def test_parquet_with_image_bytes_is_read_in_place(tmp_path):
    import numpy as np

    from krea2.curate.config import CurateConfig
    from krea2.curate.handlers import analyze_uri
    from krea2.curate.shapes import render, sample_scene
    from krea2.curate.shapes.defects import encode

    rng = np.random.default_rng(0)
    images = [encode(render(sample_scene(rng), 300, 300), "png") for _ in range(5)]
    raw = pa.table({"image": pa.array(images, pa.binary())})
    pq.write_table(raw, tmp_path / "raw.parquet", row_group_size=2)
    hf = pa.table({"image": [{"bytes": b, "path": None} for b in images]})
    pq.write_table(hf, tmp_path / "hf.parquet", row_group_size=2)
    for name in ("raw", "hf"):
        rows = list(list_source(tmp_path / f"{name}.parquet", name))
        assert [r["image_key"] for r in rows] == [f"{name}/{i:09d}" for i in range(5)]
        assert [read_uri(r["uri"]) for r in rows] == images
    result = analyze_uri((rows[3]["uri"], CurateConfig()))
    assert result["width"] == 300 and result["reject"] is None
    with pytest.raises(UserError, match="outside"):
        read_uri(rows[0]["uri"].replace("row=0", "row=99"))


def test_a_sidecar_json_becomes_the_rows_meta_and_is_not_an_image(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"a")
    (tmp_path / "a.json").write_text('{"caption": "a cat", "url": "https://x/a.jpg"}')
    (tmp_path / "b.png").write_bytes(b"b")
    (tmp_path / "notes.json").write_text("[1, 2]")  # no image of that stem: not a sidecar
    rows = {r["image_key"]: r for r in list_source(tmp_path, "s")}
    assert sorted(rows) == ["s/a.jpg", "s/b.png"]
    assert rows["s/a.jpg"]["meta"] == {"caption": "a cat", "url": "https://x/a.jpg"}
    assert rows["s/b.png"]["meta"] is None
    every = [r["image_key"] for r in list_source(tmp_path, "s", all_files=True)]
    assert every == ["s/a.jpg", "s/b.png", "s/notes.json"]


def test_a_sidecar_that_is_not_a_json_object_is_a_user_error(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"a")
    (tmp_path / "a.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="must hold a JSON object"):
        list(list_source(tmp_path, "s"))
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        list(list_source(tmp_path, "s"))


def test_the_pool_writer_puts_each_scene_in_a_sidecar():
    import tempfile
    from pathlib import Path

    from krea2.curate.shapes import Scene, make_pool, shapes_captioner, write_pool

    items = make_pool(seed=1, n_clean=3, n_per_defect=1, n_overrepresented=0,
                      classes=("flat", "exact_duplicate"))  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        write_pool(items, Path(d))
        rows = list(list_source(Path(d), "pool"))
        assert len(rows) == len(items)
        for item, row in zip(items, rows, strict=True):
            if item.scene is None:  # flat colour, exact copies: nothing drawn
                assert row["meta"] is None
                assert shapes_captioner(row["uri"], row["meta"]) == {}
            else:
                assert Scene.from_dict(row["meta"]["scene"]) == item.scene


def test_a_truncated_parquet_or_a_binary_uri_list_is_one_error_naming_the_file(tmp_path):
    pq.write_table(pa.table({"uri": ["a.jpg"] * 100}), tmp_path / "t.parquet")
    data = (tmp_path / "t.parquet").read_bytes()
    (tmp_path / "t.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"t\.parquet is not a readable Parquet file"):
        list(list_source(tmp_path / "t.parquet", "x"))
    (tmp_path / "images.bin").write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)))
    with pytest.raises(UserError, match=r"images\.bin is not a text file of URIs"):
        list(list_source(tmp_path / "images.bin", "x"))


def test_sidecar_captions_are_validated_and_a_plain_string_is_one_caption(tmp_path):
    from krea2.curate.sidecars import sidecar_captioner

    (tmp_path / "a.jpg").write_bytes(b"a")
    (tmp_path / "a.json").write_text('{"caption": "a cat on a mat"}')
    (tmp_path / "b.jpg").write_bytes(b"b")
    (tmp_path / "b.json").write_text('{"captions": {"short": "dog", "long": "a brown dog"}}')
    rows = {r["image_key"]: r for r in list_source(tmp_path, "s")}
    assert sidecar_captioner(rows["s/a.jpg"]["uri"], rows["s/a.jpg"]["meta"]) == {
        "medium": "a cat on a mat"
    }
    assert sidecar_captioner("u", rows["s/b.jpg"]["meta"]) == {
        "short": "dog",
        "long": "a brown dog",
    }
    (tmp_path / "b.json").write_text('{"captions": {"alt": "dog"}}')
    with pytest.raises(UserError, match=r"sidecar .*b\.json: caption 'alt'"):
        list(list_source(tmp_path, "s"))
    (tmp_path / "b.json").write_text('{"captions": 3}')
    with pytest.raises(UserError, match=r"b\.json: captions must be a string"):
        list(list_source(tmp_path, "s"))


def test_same_named_images_in_sub_folders_keep_their_own_key_and_sidecar(tmp_path):
    for folder in ("cats", "dogs"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "001.jpg").write_bytes(folder.encode())
        (tmp_path / folder / "001.json").write_text(f'{{"caption": "one of the {folder}"}}')
    rows = {r["image_key"]: r["meta"] for r in list_source(tmp_path, "s")}
    assert rows == {
        "s/cats/001.jpg": {"caption": "one of the cats"},
        "s/dogs/001.jpg": {"caption": "one of the dogs"},
    }


def test_a_captioner_returning_a_plain_string_or_junk_gets_a_clear_answer():
    from krea2.curate.handlers import CaptionHandler, configured
    from krea2.curate.plugins import register_captioner

    register_captioner("plain", lambda uri, meta: f"caption of {uri}")
    register_captioner("junk", lambda uri, meta: 42)
    plain = configured(CaptionHandler, CaptionHandler.cfg, plugin="plain")()
    plain.setup()
    assert plain([{"uri": "file:///x.jpg"}]) == [
        {"captions": [{"format": "medium", "text": "caption of file:///x.jpg"}]}
    ]
    junk = configured(CaptionHandler, CaptionHandler.cfg, plugin="junk")()
    junk.setup()
    (error,) = junk([{"uri": "file:///x.jpg"}])
    assert isinstance(error, ValueError)
    assert "captioner 'junk' on file:///x.jpg" in str(error) and "must be a string" in str(error)
