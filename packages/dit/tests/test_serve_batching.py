"""The image server's dynamic batching: one sampling call for concurrent requests of one
shape, each image as if served alone, other shapes in turn, departed clients dropped."""

from __future__ import annotations

import base64
import io
import threading
import time

import httpx
import numpy as np
import pytest
from dit_test_helpers import GEN, send
from PIL import Image

from krea2.dit.image_requests import RequestLimits
from krea2.dit.image_server import ImageServerConfig, ImageServerThread
from krea2.dit.served_model import ServedModel, Shape

LIMITS = RequestLimits(max_n=4, max_steps=8, max_side=64)
FOREVER_MS = 600_000.0  # a batch closes only when full: the tests decide who is in it


class Recording:
    """Wraps a model's ``render``: records each call's (shape, prompts, seeds); ``gate``
    (when given) holds every call until set, and ``entered`` says one has begun."""

    def __init__(self, render, gate: threading.Event | None = None) -> None:
        self.inner, self.gate = render, gate
        self.calls: list[tuple[Shape, list[str], list[int]]] = []
        self.entered = threading.Event()

    def __call__(self, shape, prompts, seeds, refs=(), batch_size=None):
        self.calls.append((shape, list(prompts), list(seeds)))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(60)
        return self.inner(shape, prompts, seeds, refs, batch_size)


@pytest.fixture
def model(serving_folder, monkeypatch):
    model = ServedModel.load(serving_folder, text_tokens=16)
    monkeypatch.setattr(model, "render", Recording(model.render))
    return model


def serve(model: ServedModel, max_batch: int, wait_ms: float = FOREVER_MS) -> ImageServerThread:
    config = ImageServerConfig(max_batch=max_batch, batch_wait_ms=wait_ms, default_size="32x32",
                               limits=LIMITS)  # fmt: skip
    return ImageServerThread(model, config=config)


def wait_queued(url: str, images: int) -> None:
    deadline = time.monotonic() + 60
    while httpx.get(url + "/health").json()["queued_images"] != images:
        assert time.monotonic() < deadline, f"never {images} images queued"
        time.sleep(0.01)


def pixels(response: httpx.Response) -> list[np.ndarray]:
    assert response.status_code == 200, response.text
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(d["b64_json"]))))
        for d in response.json()["data"]
    ]


A = {"prompt": "a red circle", "steps": 2, "seed": 11}
B = {"prompt": "two blue squares on a green background", "steps": 2, "seed": 5}


def test_concurrent_requests_of_one_shape_are_sampled_in_one_call(model):
    results: dict = {}
    with serve(model, max_batch=3) as srv:
        threads = [send(srv.url, results, "a", {**A, "n": 2})]
        wait_queued(srv.url, 2)
        threads.append(send(srv.url, results, "b", B))
        for t in threads:
            t.join()
    assert len(pixels(results["a"])) == 2 and len(pixels(results["b"])) == 1
    [(shape, prompts, seeds)] = model.render.calls
    assert prompts == [A["prompt"], A["prompt"], B["prompt"]] and seeds == [11, 12, 5]
    assert shape == Shape(32, 32, 2, 4.5)


def test_a_batched_image_equals_the_same_request_served_alone(model):
    results: dict = {}
    with serve(model, max_batch=2) as srv:
        first = send(srv.url, results, "a", A)
        wait_queued(srv.url, 1)
        second = send(srv.url, results, "b", B)
        first.join(), second.join()
    with serve(model, max_batch=1, wait_ms=0) as alone:
        solo_a = pixels(httpx.post(alone.url + GEN, json=A, timeout=120))[0]
        solo_b = pixels(httpx.post(alone.url + GEN, json=B, timeout=120))[0]
    assert [len(p) for _, p, _ in model.render.calls] == [2, 1, 1]
    batched_a, batched_b = pixels(results["a"])[0], pixels(results["b"])[0]
    # Exactly what one generate call on [A, B] with seeds [11, 5] gives: the server adds
    # nothing, and each request gets its own row back.
    both = model.render.inner(Shape(32, 32, 2, 4.5), [A["prompt"], B["prompt"]], [11, 5])
    assert np.array_equal(batched_a, both[0]) and np.array_equal(batched_b, both[1])
    # Served alone: its own noise (seeded_noise) and prompt, so the same image up to the
    # float rounding of CPU kernels at another batch size (~1e-6: at most one level).
    for batched, solo in ((batched_a, solo_a), (batched_b, solo_b)):
        diff = np.abs(batched.astype(int) - solo)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    assert np.abs(batched_a.astype(int) - batched_b).max() > 8  # two different images


def test_requests_of_another_shape_wait_their_turn(model):
    results: dict = {}
    with serve(model, max_batch=2) as srv:
        threads = [send(srv.url, results, "a", A)]
        wait_queued(srv.url, 1)
        threads.append(send(srv.url, results, "small", {**A, "size": "16x16", "n": 2}))
        wait_queued(srv.url, 3)  # the small pair fills a batch; A's shape waits for B
        threads.append(send(srv.url, results, "b", B))
        for t in threads:
            t.join()
    assert all(r.status_code == 200 for r in results.values())
    sizes = [(shape.width, len(prompts)) for shape, prompts, _ in model.render.calls]
    assert sizes == [(32, 2), (16, 2)]  # A's batch first: the oldest request sets the turn


def test_a_request_over_max_batch_is_a_batch_of_its_own(model):
    with serve(model, max_batch=2, wait_ms=0) as srv:
        r = httpx.post(srv.url + GEN, json={**A, "n": 3}, timeout=120)
    assert len(pixels(r)) == 3
    assert [len(prompts) for _, prompts, _ in model.render.calls] == [3]


def test_a_request_whose_client_left_is_dropped_before_its_batch(model, monkeypatch):
    gate = threading.Event()
    held = Recording(model.render.inner, gate)
    monkeypatch.setattr(model, "render", held)
    results: dict = {}
    with serve(model, max_batch=1, wait_ms=0) as srv:
        dropped = _dropped(srv.url)
        first = send(srv.url, results, "a", A)
        assert held.entered.wait(60)  # A's batch is sampling, held at the gate
        leaving = send(srv.url, results, "gone", B, timeout=1.0)
        leaving.join()
        assert isinstance(results["gone"], httpx.TimeoutException)
        wait_queued(srv.url, 0)  # the server saw the client leave
        assert _dropped(srv.url) == dropped + 1
        gate.set()
        first.join()
        after = httpx.post(srv.url + GEN, json={**A, "seed": 1}, timeout=120)
    assert len(pixels(results["a"])) == 1 and len(pixels(after)) == 1
    # B was never sampled: the next batch after A's was the request sent after it
    assert [seeds for _, _, seeds in held.calls] == [[11], [1]]


def _dropped(url: str) -> float:
    """Requests answered 499 (their client left before their images were made)."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith('krea2_dit_serve_requests_total{status="499"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_full_queue_answers_503_and_keeps_what_it_holds(model):
    config = ImageServerConfig(max_batch=8, batch_wait_ms=2000, default_size="32x32",
                               limits=LIMITS, max_queue_images=1)  # fmt: skip
    results: dict = {}
    with ImageServerThread(model, config=config) as srv:
        waiting = send(srv.url, results, "a", A)
        wait_queued(srv.url, 1)
        full = httpx.post(srv.url + GEN, json=B, timeout=60)
        waiting.join()
    assert full.status_code == 503 and "1 images are queued" in full.json()["error"]["message"]
    assert len(pixels(results["a"])) == 1
