"""The reward server against hostile requests (issue #38, M4): every probe gets a 4xx with
its reason, decided before the bytes it is about are read or decoded; never a 500."""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import zlib

import httpx
import numpy as np
import pytest
from PIL import Image

from krea2.curate import shapes
from krea2.rl.rewards import RewardClient, ServerConfig, ServerThread, ShapesRubricReward
from krea2.rl.rewards.wire import BINARY_TYPE, RequestLimits, encode_images


class _Counting:
    def __init__(self, inner):
        self.inner, self.name, self.calls = inner, inner.name, []

    def __call__(self, images, prompts):
        self.calls.append(len(prompts))
        return self.inner(images, prompts)


@pytest.fixture(scope="module")
def reward():
    return _Counting(ShapesRubricReward(ocr=False))


@pytest.fixture(scope="module")
def server(reward):
    with ServerThread(reward, config=ServerConfig(token="secret")) as srv:
        yield srv


SMALL = RequestLimits(
    max_body_bytes=20_000, max_images=4, max_image_pixels=10_000, max_request_pixels=15_000
)


@pytest.fixture(scope="module")
def small(reward):
    """A server with tiny limits, so each can be passed by a small request."""
    with ServerThread(reward, config=ServerConfig(limits=SMALL)) as srv:
        yield srv


def _post(server, body, token="secret"):
    return httpx.post(
        f"{server.url}/score", json=body, headers={"Authorization": f"Bearer {token}"}
    )


def _post_raw(server, content: bytes, content_type: str = "application/json"):
    headers = {"Authorization": "Bearer secret", "Content-Type": content_type}
    return httpx.post(f"{server.url}/score", content=content, headers=headers)


def _png(width: int, height: int, pixels: bool = True) -> bytes:
    """A PNG of ``width`` x ``height`` black RGB pixels, compressed row by row (an
    8000 x 8000 file is ~190 KB and never exists decoded here); ``pixels=False``: the header
    alone (a 69-byte file that declares the size and holds no image data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    head = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    data = b""
    if pixels:
        z, row = zlib.compressobj(9), bytes(1 + 3 * width)
        data = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return b"\x89PNG\r\n\x1a\n" + head + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _file(img: np.ndarray, fmt: str) -> str:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def _scene(seed: int = 0, size: int = 48):
    scene = shapes.sample_scene(np.random.default_rng(seed))
    return shapes.render(scene, size, size), shapes.captions(scene)["medium"]


def _status_line(host: str, port: int, request: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(request)
        return s.recv(65536).split(b"\r\n", 1)[0]


def test_a_declared_oversized_body_is_refused_before_a_byte_of_it_is_read(server):
    # Headers only: a server that waited for the gigabyte would never answer (socket timeout).
    request = (
        b"POST /score HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer secret\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
    )
    assert b" 413 " in _status_line(server.host, server.port, request)


def test_a_chunked_body_is_cut_off_as_soon_as_it_passes_the_cap(small):
    body = iter([b"[" + b"0," * 6000, b"0]" + b" " * 10_000])  # chunked: no Content-Length
    r = httpx.post(f"{small.url}/score", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "over 20000 bytes" in r.json()["detail"]


@pytest.mark.parametrize("size", [30000, 8000])
def test_an_image_declaring_too_many_pixels_is_refused_from_its_header(server, size):
    header_only = base64.b64encode(_png(size, size, pixels=False)).decode()
    assert len(base64.b64decode(header_only)) < 80  # the 69-byte probe
    r = _post(server, {"prompts": ["a red circle"], "png": [header_only]})
    assert r.status_code == 413, r.text  # not 422 "truncated": it was never decoded
    assert f"over {4096 * 4096} pixels" in r.json()["detail"] or (
        f"{size}x{size} = {size * size} pixels" in r.json()["detail"]
    )


def test_two_real_8000_pixel_pngs_in_a_half_megabyte_request_are_refused_undecoded(server):
    big = base64.b64encode(_png(8000, 8000)).decode()
    body = {"prompts": ["a red circle", "a blue square"], "png": [big, big]}
    assert len(httpx.Request("POST", "/", json=body).content) < 600_000  # the 498 KB probe
    r = _post(server, body)
    assert r.status_code == 413
    assert "image 0 is 8000x8000 = 64000000 pixels" in r.json()["detail"]


def test_the_pixel_budget_of_a_request_counts_all_its_images(small):
    files = [base64.b64encode(_png(100, 80, pixels=False)).decode()] * 2  # 8000 px each
    r = httpx.post(f"{small.url}/score", json={"prompts": ["a", "b"], "png": files})
    assert r.status_code == 413 and "per request" in r.json()["detail"]
    raw = {"prompts": ["a"] * 5, "images": {"shape": [5, 1, 1, 3], "data": ""}}
    r = httpx.post(f"{small.url}/score", json=raw)
    assert r.status_code == 413 and "5 images in one request" in r.json()["detail"]


@pytest.mark.parametrize("fmt", ["BMP", "GIF", "TIFF", "EPS"])
def test_only_png_jpeg_and_webp_files_are_opened(server, fmt):
    image, prompt = _scene()
    if fmt == "EPS":  # Pillow hands an EPS file to Ghostscript when it is installed
        data = base64.b64encode(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 48 48\n").decode()
    else:
        data = _file(image, fmt)
    r = _post(server, {"prompts": [prompt], "png": [data]})
    assert r.status_code == 422
    assert "not a PNG, JPEG or WebP file" in r.json()["detail"]


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP"])
def test_jpeg_and_webp_files_are_scored(server, fmt):
    image, prompt = _scene()
    r = _post(server, {"prompts": [prompt], "png": [_file(image, fmt)]})
    assert r.status_code == 200 and len(r.json()["scores"]) == 1


@pytest.mark.parametrize(
    "shape",
    [[True, True, True, 3], [1, 4.0, 4, 3], [1, 0, 4, 3], [-1, 4, 4, 3], [1, 4, 4, "3"]],
    ids=["booleans", "float", "zero-height", "negative", "string"],
)
def test_a_shape_of_anything_but_positive_integers_is_a_422(server, shape):
    r = _post(server, {"prompts": ["x"], "images": {"shape": shape, "data": "AAAA"}})
    assert r.status_code == 422 and "[B, H, W, 3] of integers" in r.json()["detail"]
    header = json.dumps({"prompts": ["x"], "shape": shape}).encode()
    r = _post_raw(server, len(header).to_bytes(4, "big") + header + b"\0\0\0", BINARY_TYPE)
    assert r.status_code == 422 and "[B, H, W, 3] of integers" in r.json()["detail"]


def test_a_shape_too_big_for_any_body_is_a_413_not_an_overflow(server):
    shape = [10**30, 4096, 4096, 3]
    r = _post(server, {"prompts": ["x"], "images": {"shape": shape, "data": ""}})
    assert r.status_code == 413 and "images in one request" in r.json()["detail"]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"[" * 100_000, "nests deeper than 32"),
        (b'{"prompts": ' + b"[" * 40 + b"]" * 40 + b"}", "nests deeper than 32"),
        (b"[" + b"0," * 200_000 + b"0]", "more than 100000 values"),
        (b'{"request_id": ' + b"9" * 5000 + b"}", "not JSON"),
        (b'{"prompts": ["x"], "png": "\xff\xfe"}', "not JSON"),
    ],
    ids=["deep", "nested-prompts", "wide", "huge-int", "not-utf8"],
)
def test_json_too_deep_too_wide_or_unparsable_is_a_400(server, content, says):
    r = _post_raw(server, content)
    assert r.status_code == 400 and says in r.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"prompts": ["x"], "png": [123]},
        {"prompts": ["x"], "png": ["@@@"]},
        {"prompts": ["x"], "png": {"a": 1}},
        {"prompts": [None], "images": encode_images(np.zeros((1, 4, 4, 3), np.uint8))},
        {"prompts": ["x"], "images": {"shape": [1, 4, 4, 3], "data": 5}},
        {"prompts": ["x"], "request_id": "r" * 257, "images": {"shape": [0, 1, 1, 3], "data": ""}},
        {"prompts": "x", "images": {"shape": [1, 1, 1, 3], "data": "AAAA"}},
    ],
)
def test_malformed_fields_are_a_422_never_a_500(server, body):
    r = _post(server, body)
    assert r.status_code == 422, r.text


def test_a_truncated_png_behind_a_valid_header_is_a_422(server):
    image, prompt = _scene()
    data = base64.b64decode(_file(image, "PNG"))
    r = _post(server, {"prompts": [prompt], "png": [base64.b64encode(data[:120]).decode()]})
    assert r.status_code == 422 and "truncated or corrupt" in r.json()["detail"]


def test_a_reused_request_id_with_another_body_is_scored_on_its_own(server, reward):
    (a, pa), (b, pb) = _scene(1), _scene(2)
    first = {"request_id": "reused", "prompts": [pa], "images": encode_images(a[None])}
    other = {"request_id": "reused", "prompts": [pb], "images": encode_images(b[None])}
    before = len(reward.calls)
    got_first, got_other = _post(server, first).json(), _post(server, other).json()
    assert len(reward.calls) == before + 2  # the second body was scored, not looked up
    assert got_other["scores"] == pytest.approx(reward.inner(b[None], [pb]).scores.tolist())
    assert _post(server, first).json() == got_first  # a true retry is still answered
    assert len(reward.calls) == before + 2


def test_the_client_splits_batches_to_fit_the_body_cap(small, reward):
    scenes = [_scene(i, size=40) for i in range(6)]  # 4800 bytes an image: 4 fit in 20 000
    images, prompts = np.stack([s[0] for s in scenes]), [s[1] for s in scenes]
    with RewardClient(small.url, max_request_bytes=10_000) as client:  # 2 images a request
        np.testing.assert_array_equal(
            client(images, prompts).scores, reward.inner(images, prompts).scores
        )
        assert client.attempts == 3
    health = httpx.get(f"{small.url}/health").json()
    assert health["limits"]["max_body_bytes"] == 20_000


def test_serve_reward_refuses_a_public_host_without_a_token(capsys, monkeypatch):
    from krea2.infra.host import run_cli
    from krea2.rl.cli import app

    monkeypatch.delenv("KREA2_REWARD_TOKEN", raising=False)
    assert run_cli(app, ["serve-reward", "--kind", "rubric", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--token" in err and "KREA2_REWARD_TOKEN" in err
    with pytest.raises(ValueError, match="exposes the reward server"):
        ServerThread(_Counting(ShapesRubricReward(ocr=False)), host="0.0.0.0")
