"""`krea2 dit serve`'s HTTP API on loopback: the OpenAI Images shape, URLs, Turbo and style
settings, health and metrics, the expander in front, and a 4xx with its reason for every
bad request."""

from __future__ import annotations

import base64
import io
import json
import shutil
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from PIL import Image

from krea2.dit.image_requests import RequestLimits
from krea2.dit.image_server import ImageServerConfig, ImageServerThread
from krea2.dit.served_model import ServedModel

LIMITS = RequestLimits(max_n=4, max_steps=8, max_side=64, max_body_bytes=64 * 1024)
CONFIG = ImageServerConfig(default_size="32x32", limits=LIMITS, keep_images=4)
GEN = "/v1/images/generations"


def post(url: str, body: dict | bytes, token: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, bytes):
        return httpx.post(url + GEN, content=body, headers=headers, timeout=120)
    return httpx.post(url + GEN, json=body, headers=headers, timeout=120)


def pixels(item: dict) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item["b64_json"]))))


def png_b64(array: np.ndarray, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


REF = png_b64(np.random.default_rng(0).integers(0, 255, (24, 24, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def model(serving_folder):
    return ServedModel.load(serving_folder, text_tokens=16)


@pytest.fixture(scope="module")
def server(model):
    with ImageServerThread(model, config=CONFIG) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def styled(styled_folder):
    model = ServedModel.load(styled_folder, text_tokens=16)
    with ImageServerThread(model, config=CONFIG) as srv:
        yield srv.url


def test_a_generation_has_the_openai_shape_with_one_seed_per_image(server):
    r = post(server, {"prompt": "a red circle", "n": 2, "size": "40x24", "steps": 2, "seed": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["created"], int) and len(body["data"]) == 2
    assert [item["seed"] for item in body["data"]] == [5, 6]
    assert all("revised_prompt" not in item for item in body["data"])
    first, second = (pixels(item) for item in body["data"])
    assert first.shape == (24, 40, 3) and first.dtype == np.uint8
    assert not np.array_equal(first, second)


def test_a_seed_gives_the_same_image_again_and_image_i_uses_seed_plus_i(server):
    body = {"prompt": "a red circle", "steps": 2, "seed": 7}
    one, again = (post(server, body).json()["data"][0] for _ in range(2))
    eighth = post(server, {**body, "seed": 8}).json()["data"][0]
    two = post(server, {**body, "n": 2}).json()["data"]
    assert one["b64_json"] == again["b64_json"] != eighth["b64_json"]
    # one sampling call for both: equal up to the rounding of batched CPU kernels
    assert np.abs(pixels(two[0]).astype(int) - pixels(one)).max() <= 1
    assert np.abs(pixels(two[1]).astype(int) - pixels(eighth)).max() <= 1


def test_a_url_response_serves_the_png_from_a_bounded_store(server):
    body = {"prompt": "a red circle", "steps": 2, "seed": 3}
    inline = post(server, body).json()["data"][0]
    linked = post(server, {**body, "response_format": "url"}).json()["data"][0]
    assert "b64_json" not in linked and linked["url"].startswith(server)
    got = httpx.get(linked["url"])
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    assert got.content == base64.b64decode(inline["b64_json"])
    for _ in range(CONFIG.keep_images):  # push it out of the store
        post(server, {**body, "response_format": "url"})
    gone = httpx.get(linked["url"])
    assert gone.status_code == 404 and "evicted" in gone.json()["error"]["message"]


def test_turbo_samples_with_turbos_own_steps_and_no_cfg(server):
    turbo = post(server, {"prompt": "a red circle", "turbo": True, "seed": 1}).json()["data"]
    spelled = {"prompt": "a red circle", "turbo": True, "steps": 8, "cfg": 0, "seed": 1}
    assert turbo[0]["b64_json"] == post(server, spelled).json()["data"][0]["b64_json"]


def test_a_distilled_folder_defaults_to_turbo_settings(serving_folder, tmp_path):
    root = shutil.copytree(serving_folder, tmp_path / "turbo")
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    distilled = ServedModel.load(root, text_tokens=16)
    assert distilled.defaults(turbo=False) == distilled.defaults(turbo=True) == (8, 0.0)
    assert ServedModel.load(serving_folder, text_tokens=16).defaults(turbo=False) == (28, 4.5)


def test_style_references_steer_the_image_and_strength_zero_is_no_reference(styled):
    body = {"prompt": "a red circle", "steps": 2, "seed": 2}
    plain = post(styled, body).json()["data"][0]["b64_json"]
    ref = post(styled, {**body, "style_references": [{"image": REF, "strength": 1.0}]})
    assert ref.status_code == 200, ref.text
    off = post(styled, {**body, "style_references": [{"image": REF, "strength": 0}]})
    assert ref.json()["data"][0]["b64_json"] != plain
    assert off.json()["data"][0]["b64_json"] == plain
    jpeg = png_b64(np.full((16, 16, 3), 200, np.uint8), "JPEG")
    data_url = {"image": f"data:image/jpeg;base64,{jpeg}"}
    assert post(styled, {**body, "style_references": [data_url]}).status_code == 200


def test_style_times_window_the_references_and_an_empty_window_is_no_reference(styled):
    body = {"prompt": "a red circle", "steps": 4, "seed": 2}
    refs = {"style_references": [{"image": REF, "strength": 1.0}]}

    def image(extra: dict) -> str:
        r = post(styled, {**body, **extra})
        assert r.status_code == 200, r.text
        return r.json()["data"][0]["b64_json"]

    plain, always = image({}), image(refs)
    assert image({**refs, "style_times": [0, 1]}) == always
    assert image({**refs, "style_times": [0, 0]}) == plain  # no step inside the window
    late = image({**refs, "style_times": [0, 0.6]})  # integers and floats both read
    assert late not in (plain, always)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"style_times": [0, 0.5]}, "style_times: it times the style references"),
        ({"style_references": [{"image": REF}], "style_times": [0.8, 0.2]},
         "style_times: style times 0.8:0.2 must be flow times with 0 <= LO <= HI <= 1"),
        ({"style_references": [{"image": REF}], "style_times": [0, 2]}, "0 <= LO <= HI <= 1"),
        ({"style_references": [{"image": REF}], "style_times": [0.5]}, "style_times"),
        ({"style_references": [{"image": REF}], "style_times": "0:0.8"}, "style_times"),
    ],
)  # fmt: skip
def test_a_bad_style_window_gets_a_400_naming_it(styled, extra, says):
    r = post(styled, {"prompt": "x", "steps": 1, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error["message"] and error["param"].startswith("style_times")


def test_health_and_metrics_report_the_model_and_the_traffic(server):
    health = httpx.get(server + "/health").json()
    assert health["status"] == "ok" and health["ready"] and health["model"] == "tiny"
    assert health["size_multiple"] == 8 and health["style_references"] == 0
    post(server, {"prompt": "a red circle", "steps": 1})
    post(server, {"prompt": ""})
    text = httpx.get(server + "/metrics").text
    for line in ('krea2_dit_serve_requests_total{status="200"}',
                 'krea2_dit_serve_requests_total{status="400"}', "krea2_dit_serve_images_total",
                 "krea2_dit_serve_batch_images_bucket", "krea2_dit_serve_queue_images",
                 "krea2_dit_serve_request_seconds_bucket"):  # fmt: skip
        assert line in text, line
    assert httpx.get(server + "/v1/models").json()["data"][0]["id"] == "tiny"


def test_a_draining_server_refuses_new_requests_with_503(model):
    with ImageServerThread(model, config=CONFIG) as srv:
        srv.draining.set()  # what SIGTERM sets (test_serve_cli.py stops a real process)
        r = post(srv.url, {"prompt": "a red circle", "steps": 1})
        health = httpx.get(srv.url + "/health").json()
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
    assert health["status"] == "draining" and not health["ready"]


def test_off_loopback_needs_a_token_and_v1_checks_it(model):
    from krea2.infra.serving import TokenRequired

    with pytest.raises(TokenRequired, match="KREA2_DIT_TOKEN"):
        ImageServerThread(model, host="0.0.0.0", config=CONFIG)
    config = ImageServerConfig(default_size="32x32", limits=LIMITS, token="s3cret")
    with ImageServerThread(model, config=config) as srv:
        body = {"prompt": "a red circle", "steps": 1}
        for token in (None, "wrong"):
            r = post(srv.url, body, token)
            assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200  # probes stay open
        assert post(srv.url, body, "s3cret").status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{nope", 400, "not JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"[" * 5000, 400, "not JSON"),
        ({"n": 1}, 400, "prompt: Field required"),
        ({"prompt": 7}, 400, "prompt: Input should be a valid string"),
        ({"prompt": "   "}, 400, "prompt: must not be empty"),
        ({"prompt": "x", "n": "2"}, 400, "n: Input should be a valid integer"),
        ({"prompt": "x", "steps": 1.5}, 400, "steps: Input should be a valid integer"),
        ({"prompt": "x", "turbo": "yes"}, 400, "turbo: Input should be a valid boolean"),
        ({"prompt": "x", "stepz": 2}, 400, "stepz: unknown field"),
        ({"prompt": "x", "size": "big"}, 400, "must look like WIDTHxHEIGHT"),
        ({"prompt": "x", "size": "0x32"}, 400, "must be positive"),
        ({"prompt": "x", "size": "128x32"}, 400, "largest side, 64 pixels"),
        ({"prompt": "x", "size": "36x32"}, 400, "multiples of 8"),
        ({"prompt": "x", "n": 0}, 400, "n: 0 is out of range"),
        ({"prompt": "x", "n": 5}, 400, "1 to 4 images per request"),
        ({"prompt": "x", "steps": 0}, 400, "steps: 0 is out of range"),
        ({"prompt": "x", "steps": 9}, 400, "this server takes 1 to 8"),
        ({"prompt": "x"}, 400, "steps: 28 (the model's default; send steps)"),
        ({"prompt": "x", "steps": 2, "cfg": -1}, 400, "cfg: Input should be greater"),
        ({"prompt": "x", "seed": -1}, 400, "seed: Input should be greater"),
        ({"prompt": "x", "response_format": "png"}, 400, "response_format"),
        ({"prompt": "x", "model": "dall-e-3"}, 404, "not served here; use 'tiny'"),
        ({"prompt": "x" * 16_001}, 400, "prompt: 16001 characters"),
        ({"prompt": "x", "steps": 1, "style_references": [{"image": REF}]}, 400,
         "no style module"),
        ({"prompt": "x", "style_references": [{"image": REF, "strength": -1}]}, 400,
         "strength: Input should be greater than or equal to 0"),
        ({"prompt": "x", "style_references": [{"image": REF, "img": 1}]}, 400, "img: unknown"),
        ({"prompt": "x", "style_references": {"image": REF}}, 400, "style_references:"),
    ],
)  # fmt: skip
def test_a_bad_request_gets_a_4xx_naming_its_problem(server, body, status, says):
    r = post(server, body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("refs", "says"),
    [
        ([{"image": "not base64!"}], "style_references.0.image: not base64"),
        ([{"image": base64.b64encode(b"GIF89a not really").decode()}], "cannot decode the image"),
        ([{"image": REF[: len(REF) // 2 // 4 * 4]}], "cannot decode the image"),  # truncated
        ([{"image": REF}] * 3, "takes at most 2"),
    ],
)
def test_a_bad_style_reference_gets_a_400_naming_it(styled, refs, says):
    r = post(styled, {"prompt": "x", "steps": 1, "style_references": refs})
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_a_body_over_the_cap_is_refused_before_it_is_read(server):
    big = {"prompt": "x", "negative_prompt": "y" * (LIMITS.max_body_bytes + 1)}
    r = post(server, big)
    assert r.status_code == 413 and "over 65536 bytes" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the cap is applied while reading
        for _ in range(LIMITS.max_body_bytes // 1024 + 2):
            yield b" " * 1024

    r = httpx.post(server + GEN, content=chunks(), timeout=60)
    assert r.status_code == 413


# ------------------------------------------------------------------------ the expander in front
class _Chat:
    """A scripted OpenAI-compatible chat endpoint on loopback."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        def complete(body: dict) -> dict:
            time.sleep(delay_s)
            text = "expanded: " + body["messages"][-1]["content"]
            return {"choices": [{"message": {"role": "assistant", "content": text}}]}

    def __enter__(self) -> str:
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        threading.Thread(target=self.server.run, daemon=True).start()
        while not self.server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_expander_rewrites_the_prompt_and_the_expansion_is_returned(model, server):
    body = {"prompt": "a red circle", "steps": 2, "seed": 4}
    with _Chat() as chat:
        config = ImageServerConfig(default_size="32x32", limits=LIMITS, expander=chat)
        with ImageServerThread(model, config=config) as srv:
            r = post(srv.url, body)
    assert r.status_code == 200, r.text
    [item] = r.json()["data"]
    assert item["revised_prompt"] == "expanded: a red circle"
    direct = post(server, {**body, "prompt": "expanded: a red circle"}).json()["data"][0]
    assert item["b64_json"] == direct["b64_json"]  # the expansion is what was sampled


def test_a_dead_or_slow_expander_is_a_502_not_a_hang(model):
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    with _Chat(delay_s=5.0) as slow:
        for url, says in ((dead, "not reachable"), (slow, "timed out")):
            config = ImageServerConfig(default_size="32x32", limits=LIMITS, expander=url,
                                       expander_timeout_s=0.5)  # fmt: skip
            with ImageServerThread(model, config=config) as srv:
                started = time.monotonic()
                r = post(srv.url, {"prompt": "a red circle", "steps": 1})
                assert time.monotonic() - started < 4.5
            assert r.status_code == 502, r.text
            message = r.json()["error"]["message"]
            assert "prompt expander" in message and says in message, message
