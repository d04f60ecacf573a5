"""Crop ladders: crops, overlays, re-encodes, resizes and tone changes of real photos are
grouped with their original; unrelated photos, different views of one photo and flat
synthetic look-alikes (refused on their pixels) are not."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.config import CurateConfig, DedupConfig
from krea2.curate.copy_verify import LADDER_VIEW, decoding_reader, verify_read
from krea2.curate.crop_ladder import (
    LADDER_BYTES,
    LEVEL_BYTES,
    LEVELS,
    ladder_bytes,
    ladder_distances,
)
from krea2.curate.dedup import dedup, dedup_configured, ladder_pairs
from krea2.curate.dedup_partitioned import candidate_pairs
from krea2.curate.image_analysis import analyze_bytes
from krea2.curate.in_memory import dedup_analyses
from krea2.curate.photo_edits import EDIT_CLASSES, edit, encode, views
from krea2.curate.planes import planes
from krea2.curate.shapes import Background, Scene, ShapeObject, render
from krea2.curate.shapes.defects import encode as encode_pixels

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "grace_hopper.jpg")
# the real-photo setting (the default), its pairs verified on pixels
LADDER_ON = CurateConfig(dedup=DedupConfig(ladder_max_distance=20))
UNVERIFIED = CurateConfig(dedup=DedupConfig(ladder_max_distance=20, ladder_verify=0.0))
# An orange circle and triangle in one cell on black that the ladder pairs (distance 14-20,
# colour vetoes passed): the demo pool's pair of cell 8, and a closer one.
LOOK_ALIKES = {
    "cell 8": (8, (0.32, 0.48), (-0.34, 0.38)),
    "cell 6": (6, (0.0, 0.0), (-0.2, 0.4)),
}


def look_alikes(cell: int, circle: tuple, triangle: tuple) -> list[bytes]:
    """PNGs of a medium orange circle and triangle in ``cell`` at the given jitters."""
    return [
        encode_pixels(render(Scene((ShapeObject(s, "orange", cell, "medium", j),),
                                   Background("solid", "black")), 320, 320), "png")
        for s, j in (("circle", circle), ("triangle", triangle))
    ]  # fmt: skip


def stacked(analyses, key: str) -> np.ndarray:
    return np.stack([np.frombuffer(a.hashes[key], np.uint8) for a in analyses])


@pytest.fixture(scope="module")
def photos(real_photos) -> dict[str, Image.Image]:
    return {n: Image.open(io.BytesIO(real_photos[n])).convert("RGB") for n in PHOTOS}


def _groups(items: list[tuple[str, bytes]]) -> list[set[str]]:
    """Duplicate groups (as sets of item names) of the analyzed items, in-memory dedup (of
    every decoded item: a copy the resolution filter would reject still counts here)."""
    analyses = [analyze_bytes(data) for _, data in items]
    assert all(a.decode_error is None for a in analyses)
    result = dedup_analyses(analyses, LADDER_ON, [data for _, data in items])
    return [{items[i][0] for i in g} for g in result.groups()]


@pytest.mark.parametrize("kind", EDIT_CLASSES)
def test_an_edited_copy_is_grouped_with_its_original_and_nothing_else(photos, kind):
    rng = np.random.default_rng(EDIT_CLASSES.index(kind))
    items = [(n, encode(img, quality=95)) for n, img in photos.items()]
    items += [(f"{n}~{kind}{r}", edit(img, kind, rng)) for n, img in photos.items() for r in (0, 1)]
    groups = _groups(items)
    for n in photos:  # each photo's group is exactly itself and its two copies
        assert {n, f"{n}~{kind}0", f"{n}~{kind}1"} in groups, (n, groups)
    assert len(groups) == len(photos)


def test_two_views_of_one_photo_that_overlap_by_less_than_half_are_not_grouped(photos):
    rng = np.random.default_rng(0)
    items = [(f"{n}#{i}", encode(v, quality=95)) for n, img in photos.items()
             for i, v in enumerate(views(img, rng))]  # fmt: skip
    assert _groups(items) == []


def test_levels_are_nested_centred_crops_and_flat_levels_are_empty(photos):
    luma = planes(np.asarray(photos["coffee.png"])).luma
    levels = np.frombuffer(ladder_bytes(luma), np.uint8).reshape(LEVELS, LEVEL_BYTES)
    assert len(ladder_bytes(luma)) == LADDER_BYTES and (levels[:, 0] & 0x80).all()  # DC bit set
    # The centred crop keeping 0.94² of each side is level 2 of the photo: the copy's level 0.
    h, w = luma.shape
    fh, fw = round(h * 0.94**2), round(w * 0.94**2)
    y, x = (h - fh) // 2, (w - fw) // 2
    crop = np.ascontiguousarray(luma[y : y + fh, x : x + fw])
    copy = np.frombuffer(ladder_bytes(crop), np.uint8).reshape(LEVELS, LEVEL_BYTES)
    bits = np.unpackbits(copy[0] ^ levels[2]).sum()
    assert bits <= 8, bits
    flat = np.full((64, 80), 117, np.uint8)
    assert ladder_bytes(flat) == bytes(LADDER_BYTES)  # no information: empty, never matched
    both = np.stack([np.frombuffer(ladder_bytes(flat), np.uint8)] * 2)
    assert ladder_distances(both, np.array([[0, 1]])).tolist() == [255]


def test_three_levels_of_one_scale_must_agree_not_one():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (LEVELS, LEVEL_BYTES), dtype=np.uint8)
    a[:, 0] |= 0x80  # real levels have their DC bit set
    one, three, crossed = (rng.integers(0, 256, a.shape, dtype=np.uint8) | 0x80 for _ in "abc")
    one[9] = a[9]  # only the innermost level agrees (a look-alike layout)
    three[2:5] = a[4:7]  # levels 4-6 of a are 2-4 of b: b is a crop keeping 0.94² per side
    crossed[0], crossed[5], crossed[9] = a[4], a[1], a[6]  # three levels, no common scale
    ladders = np.stack([a, one, three, crossed]).reshape(4, -1)
    d = ladder_distances(ladders, np.array([[0, 1], [0, 2], [0, 3]]))
    assert d[0] > 40 and d[1] == 0 and d[2] > 40


def test_partitioned_ladder_search_finds_the_in_memory_pairs(photos, tmp_path):
    rng = np.random.default_rng(5)
    items = [encode(img) for img in photos.values()]
    items += [edit(img, k, rng) for img in photos.values() for k in ("crop", "overlay_box")]
    hashes = [analyze_bytes(d).hashes for d in items]
    ladder, colour, hue = (
        np.stack([np.frombuffer(h[k], np.uint8) for h in hashes])
        for k in ("ladder", "colorhash", "huehist")
    )
    in_memory = ladder_pairs(ladder, colour, hue=hue)
    spilled = ladder_pairs(ladder, colour, hue=hue, memory_bytes=40_000, workdir=str(tmp_path))
    # original ~ crop ~ box, and the two copies with each other
    assert len(in_memory) == 3 * len(photos) and in_memory.tolist() == spilled.tolist()
    assert list(tmp_path.iterdir()) == []


def test_a_row_without_a_ladder_is_deduplicated_by_its_phash_alone(photos):
    rng = np.random.default_rng(1)
    img = photos["chelsea.png"]
    datas = [encode(img), edit(img, "crop", rng), encode(img)]
    analyses = [analyze_bytes(d) for d in datas]
    read = decoding_reader(datas.__getitem__, [(a.width, a.height) for a in analyses])
    args = ([a.md5 for a in analyses], *(stacked(analyses, k) for k in ("phash12", "colorhash",
            "phash8")), np.ones(3), stacked(analyses, "huehist"), LADDER_ON.dedup)  # fmt: skip
    assert dedup_configured(*args, stacked(analyses, "ladder"), read).groups() == [[0, 1, 2]]
    old = stacked(analyses, "ladder").copy()
    old[1] = 0  # analysed before ladders: the crop is found by nothing else
    assert dedup_configured(*args, old, read).groups() == [[0, 2]]


@pytest.mark.parametrize("case", LOOK_ALIKES)
def test_a_circle_and_triangle_the_ladder_pairs_are_refused_and_a_photos_crop_is_kept(
    real_photos, case
):
    shapes = look_alikes(*LOOK_ALIKES[case])
    photo = Image.open(io.BytesIO(real_photos["coffee.png"])).convert("RGB")
    w, h = photo.size
    box = (round(w * 0.05), round(h * 0.05), round(w * 0.95), round(h * 0.95))
    datas = [*shapes, encode(photo, "PNG"), encode(photo.crop(box), quality=85)]  # 90% crop
    analyses = [analyze_bytes(d) for d in datas]
    pairs = np.array([[0, 1], [2, 3]])
    threshold = LADDER_ON.dedup.ladder_verify
    assert (ladder_distances(stacked(analyses, "ladder"), pairs) <= 20).all()
    read = decoding_reader(datas.__getitem__, [(a.width, a.height) for a in analyses])
    ok, scores = verify_read(pairs, read, threshold, LADDER_VIEW)
    assert ok.tolist() == [False, True], scores
    # Through dedup: the ladder alone merges the shapes; verified, only the crop is grouped.
    assert [0, 1] in dedup_analyses(analyses, UNVERIFIED).groups()
    assert dedup_analyses(analyses, LADDER_ON, datas).groups() == [[2, 3]]


def test_ladder_pairs_without_pixels_to_verify_them_are_an_error_naming_the_fix(photos):
    analyses = [analyze_bytes(encode(img)) for img in photos.values()]
    args = ([a.md5 for a in analyses], *(stacked(analyses, k) for k in ("phash12", "colorhash",
            "phash8")), np.ones(len(analyses)))  # fmt: skip
    with pytest.raises(ValueError, match="ladder_verify=0"):
        dedup(*args, ladder=stacked(analyses, "ladder"))
    assert dedup(*args, ladder=stacked(analyses, "ladder"), ladder_verify=0).groups() == []


def test_stop_keys_shared_by_too_many_rows_give_no_candidates():
    popular = (np.uint64(7) << np.uint64(32)) | np.arange(5, dtype=np.uint64)
    rare = (np.uint64(9) << np.uint64(32)) | np.array([1, 3, 3], np.uint64)  # a repeat
    records = np.concatenate([popular, rare])
    pairs = np.concatenate(list(candidate_pairs(records, 100, max_group=4)))
    assert pairs.tolist() == [[1, 3]]


def test_the_dedup_pass_groups_a_crop_refuses_look_alikes_and_counts_rows_without_ladders(
    tmp_path, cluster_file, photos
):
    pool = tmp_path / "pool"
    pool.mkdir()
    rng = np.random.default_rng(2)
    for n, img in photos.items():
        (pool / f"{n}.png").write_bytes(encode(img, "PNG"))
        (pool / f"{n}-crop.jpg").write_bytes(edit(img, "crop", rng))
    circle, triangle = look_alikes(*LOOK_ALIKES["cell 8"])
    (pool / "circle.png").write_bytes(circle)
    (pool / "triangle.png").write_bytes(triangle)
    c = str(cluster_file)
    runner = CliRunner()
    # the command of issue #38's report, with no setting: crops are found by default
    for args in (["ingest", str(pool), "--cluster", c],
                 ["run", "--stages", "analyze,dedup", "--cluster", c]):  # fmt: skip
        result = runner.invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    wh = curate.open_warehouse(c)
    rows = curate.read_rows(wh, ["uri", "dup_kind", "dup_of"])
    name = {r["image_key"]: r["uri"].rsplit("/", 1)[-1] for r in rows}
    dropped = {name[r["image_key"]]: name[r["dup_of"]] for r in rows if r["dup_kind"]}
    assert dropped == {f"{n}-crop.jpg": f"{n}.png" for n in photos}  # not the triangle
    stats = curate.run_stages(wh, ["dedup"], LADDER_ON)["dedup"]
    assert stats["ladder_refused"] >= 1 and stats["duplicates"] == len(photos), stats
    # A warehouse analysed before ladders existed: the column is added empty.
    with wh.funnel() as f:
        f.patch(curate.TABLE, [{"image_key": r["image_key"], "ladder": None} for r in rows])
        f.flush()
    again = curate.run_stages(wh, ["dedup"], LADDER_ON)["dedup"]
    wh.close()
    assert again["rows_without_crop_ladder"] == len(rows) and again["rows"] == len(rows)


def test_the_ladder_is_on_by_default_and_verified_on_pixels():
    d = CurateConfig().dedup
    assert d.ladder_max_distance == 20 and d.ladder_verify > 0
