"""The toy captioner's server under hostile input: every probe gets a 4xx with its reason,
never a traceback or a dropped connection, and it will not bind off loopback without a token."""

from __future__ import annotations

import base64
import http.client
import io
import json

import numpy as np
import pytest
from PIL import Image

from krea2.curate.shapes import Scene, ShapeObject, render
from krea2.curate.shapes.caption_server import MAX_BODY_BYTES, start_caption_server
from krea2.infra.serving import TokenRequired

ROUTE = "/v1/chat/completions"


def post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", ROUTE)
    for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
        if v is not None:
            conn.putheader(k, v)
    conn.endheaders()
    if body:
        conn.send(body)
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read() or b"{}")
    conn.close()
    return out


def image_request(data: bytes, mime: str = "image/png") -> bytes:
    url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    content = [
        {"type": "text", "text": "Describe."},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return json.dumps({"messages": [{"role": "user", "content": content}]}).encode()


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server():
    srv, url = start_caption_server()
    yield url
    srv.shutdown()


def test_a_rendered_scene_is_described(server):
    scene = Scene((ShapeObject("circle", "red", 0),))
    status, body = post(server, image_request(png(render(scene, 128, 128))))
    assert status == 200, body
    assert "red circle" in body["choices"][0]["message"]["content"]


def test_hostile_requests_get_a_4xx_with_the_reason(server, corrupt_corpus):
    # Declared over the cap: refused before a byte is read (none is sent).
    status, body = post(server, b"", {"Content-Length": str(MAX_BODY_BYTES + 1)})
    assert status == 413 and "body over" in body["error"]
    status, body = post(server, b"{}", {"Content-Length": None})
    assert status == 411
    # A 69-byte PNG declaring 30000 x 30000: refused from its header, not decoded.
    status, body = post(server, image_request(corrupt_corpus["bomb.png"][0]))
    assert status == 413 and "too_many_pixels" in body["error"]
    # A format outside the allowlist (PostScript would start Ghostscript) and plain junk.
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    for data in (eps, b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b"not an image"):
        status, body = post(server, image_request(data))
        assert status == 422 and "image refused" in body["error"], data[:10]
    probes = [
        b"{not json",
        b"[" * 100_000 + b"]" * 100_000,  # nested past the parser's recursion limit
        json.dumps({"messages": "text"}).encode(),
        json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]}).encode(),
    ]  # fmt: skip
    for probe in probes:
        status, body = post(server, probe)
        assert status == 400 and body["error"].startswith("bad request"), probe[:40]
    scene = Scene((ShapeObject("square", "blue", 4),))  # still serving after all of them
    assert post(server, image_request(png(render(scene, 64, 64))))[0] == 200


def test_off_loopback_it_needs_a_token_and_checks_it():
    with pytest.raises(TokenRequired, match="KREA2_CAPTION_TOKEN"):
        start_caption_server(host="0.0.0.0")
    srv, url = start_caption_server(token="s3cret")
    try:
        request = json.dumps({"messages": [{"role": "user", "content": "Description: a"}]})
        assert post(url, request.encode())[0] == 401
        assert post(url, request.encode(), {"Authorization": "Bearer nope"})[0] == 401
        status, _ = post(url, request.encode(), {"Authorization": "Bearer s3cret"})
        assert status == 200
    finally:
        srv.shutdown()
