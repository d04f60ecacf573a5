"""The style stage's training shards: content-only captions, a reference in the row's style,
and (``uncaptioned``) scenes holding one object no caption names."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from krea2.curate.shapes import split_concepts
from krea2.pipeline.style_data import write_style_shards


def _rows(tmp_path, name: str, uncaptioned: float) -> list[dict]:
    concepts = list(split_concepts(0, 0.2).train)
    out = write_style_shards(tmp_path / name, concepts, 12, 32, 5, 4, uncaptioned=uncaptioned)
    return pq.read_table(out / "shard-000.parquet").to_pylist()


def test_uncaptioned_objects_are_in_the_image_and_in_no_caption(tmp_path):
    plain, extra = _rows(tmp_path, "plain", 0.0), _rows(tmp_path, "extra", 1.0)
    for a, b in zip(plain, extra, strict=True):
        one = json.loads(a["meta"])["scene"]["objects"]
        two = json.loads(b["meta"])["scene"]["objects"]
        assert len(one) == 1 and len(two) == 2 and two[0] == one[0]
        # the captions and the reference are the plain row's: only the image gained an object
        assert a["captions"] == b["captions"] and a["reference"] == b["reference"]
        assert a["image"] != b["image"]
        texts = " ".join(c["text"].lower() for c in b["captions"])
        assert one[0]["shape"] in texts
        assert f"{two[1]['color']} {two[1]['shape']}" not in texts
