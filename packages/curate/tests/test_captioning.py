"""OCR text → VLM caption → LLM rewrites, against a real local OpenAI-compatible server."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from krea2 import curate
from krea2.curate.captioning import caption_batch, clients, omissions, parse_formats
from krea2.curate.config import CaptionConfig
from krea2.curate.shapes import Background, Scene, ShapeObject, encode, render
from krea2.curate.shapes.caption_server import start_caption_server
from krea2.curate.vlm import VlmUnavailable
from krea2.infra import CAPTION_FORMATS


def scene(*objects: tuple[str, str, int]) -> Scene:
    objs = tuple(ShapeObject(s, c, cell, "large") for c, s, cell in objects)
    return Scene(objs, Background("solid", "dark gray"))


SCENES = [
    scene(("red", "circle", 0), ("blue", "square", 8)),
    scene(("red", "triangle", 4)),
    scene(("green", "diamond", 2), ("red", "square", 6)),
    scene(("blue", "circle", 4)),
]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[dict]:
    d = tmp_path_factory.mktemp("captions")
    rows = []
    for i, s in enumerate(SCENES):
        path = d / f"{i}.png"
        path.write_bytes(encode(render(s, 256, 256), "png"))
        ocr = "SALE" if i == 1 else ""
        tags = sorted({f"{o.color} {o.shape}" for o in s.objects})
        rows.append(
            {"uri": path.as_uri(), "meta": {"source": "test"}, "ocr_text": ocr, "tags": tags}
        )
    return rows


def config(url: str, **kw) -> CaptionConfig:
    return CaptionConfig(**{"vlm_url": url, "retries": 2, "timeout_s": 10.0, **kw})


def run(rows: list[dict], url: str, **kw) -> list:
    c = config(url, **kw)
    vlm, llm = clients(c)
    try:
        return caption_batch(vlm, llm, rows, c)
    finally:
        vlm.close()
        llm.close()


def as_dict(result: dict) -> dict[str, str]:
    return {c["format"]: c["text"] for c in result["captions"]}


def test_every_row_gets_the_five_formats_from_the_vlm_and_the_rewrite(images):
    server, url = start_caption_server()
    try:
        out = run(images, url)
    finally:
        server.shutdown()
    for row, result, s in zip(images, out, SCENES, strict=True):
        caps = as_dict(result)
        assert set(caps) == set(CAPTION_FORMATS)
        for o in s.objects:  # the VLM saw the pixels: every object, its colour and place
            assert f"{o.color} {o.shape}" in caps["long"] and f"{o.color} {o.shape}" in caps["tags"]
        if row["ocr_text"]:  # the OCR text given in the prompt is quoted
            assert '"SALE"' in caps["long"] and json.loads(caps["json"])["text"] == "SALE"
    assert omissions([{**r, **o} for r, o in zip(images, out, strict=True)], 0.5, 1)[0] == {}


def test_an_overloaded_server_is_retried_and_a_down_one_fails_each_row_alone(images):
    server, url = start_caption_server(fail_first=2)
    try:
        out = run(images[:1], url, concurrency=1)
    finally:
        server.shutdown()
    assert set(as_dict(out[0])) == set(CAPTION_FORMATS)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = run(images, f"http://127.0.0.1:{port}", retries=1)
    assert all(isinstance(r, VlmUnavailable) for r in down)
    assert "check that it is up" in str(down[0])


def test_garbage_answers_are_asked_again_then_fail_alone(images):
    server, url = start_caption_server(garbage=True)
    try:
        out = run(images[:2], url, garbage_retries=1)
    finally:
        server.shutdown()
    assert all(isinstance(r, ValueError) and "unusable answer" in str(r) for r in out)
    with pytest.raises(ValueError, match="needs the keys"):
        parse_formats('{"long": "x"}')
    assert parse_formats(json.dumps({f: f"{f} text" for f in CAPTION_FORMATS}))["json"]


def test_an_unreadable_image_fails_alone(images, tmp_path):
    bad = {**images[0], "uri": (tmp_path / "missing.png").as_uri()}
    server, url = start_caption_server()
    try:
        out = run([bad, images[1]], url)
    finally:
        server.shutdown()
    assert isinstance(out[0], OSError) and set(as_dict(out[1])) == set(CAPTION_FORMATS)


def test_a_vlm_that_never_names_a_colour_is_caught_by_the_caption_check(images):
    server, url = start_caption_server(omit_colors=frozenset({"red"}))
    try:
        out = run(images, url)
    finally:
        server.shutdown()
    rows = [{**r, **o} for r, o in zip(images, out, strict=True)]
    rates, per_row = omissions(rows, min_rate=0.5, min_rows=2)
    assert rates == {"red": 1.0}
    assert per_row == [["red"], ["red"], ["red"], []]


def test_the_captions_job_writes_rows_and_the_check_rejects_the_omissions(
    images, cluster_file, tmp_path
):
    from typer.testing import CliRunner

    from krea2.curate.cli import app

    pool = tmp_path / "pool"
    pool.mkdir()
    for i, r in enumerate(images):
        (pool / f"{i}.png").write_bytes(Path(r["uri"].removeprefix("file://")).read_bytes())
    c = str(cluster_file)
    assert (
        CliRunner().invoke(app, ["ingest", str(pool), "--name", "p", "--cluster", c]).exit_code == 0
    )
    wh = curate.open_warehouse(c)
    # The earlier stages' results, set directly (OCR and tags are tested on their own).
    patch = []
    for r in curate.read_rows(wh, ["uri"]):
        i = int(r["uri"].rsplit("/", 1)[-1].split(".")[0])
        tags, ocr = images[i]["tags"], images[i]["ocr_text"]
        patch.append(
            {"image_key": r["image_key"], "text_reject": "", "ocr_text": ocr, "tags": tags}
        )
    with wh.funnel() as f:
        f.patch(curate.TABLE, patch)
        f.flush()
    server, url = start_caption_server(omit_colors=frozenset({"red"}))
    try:
        cfg = curate.load_curate_config(
            overrides=[f"captions.vlm_url={url}", "captions.min_rows=2"]
        )
        results = curate.run_stages(wh, ["captions", "caption_check"], cfg, captioner="vlm")
    finally:
        server.shutdown()
    rows = curate.read_rows(wh, ["uri", "captions", "caption_reject", "caption_omits"])
    wh.close()
    assert results["captions"].completed == len(images)
    assert all({c["format"] for c in r["captions"]} == set(CAPTION_FORMATS) for r in rows)
    assert results["caption_check"] == {"rows": 4, "rejected": 3, "omitted": {"red": 1.0}}
    for r in rows:
        red = any("red" in t for t in images[int(r["uri"].rsplit("/", 1)[-1][0])]["tags"])
        assert (r["caption_reject"], r["caption_omits"]) == (
            ("caption_omission", "red") if red else ("", "")
        )
        assert curate.final_reason(r) == ("caption_omission" if red else None)
