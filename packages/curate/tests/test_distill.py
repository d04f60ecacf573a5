"""VLM pseudo-labels through an OpenAI-compatible server, and a calibrated head on embeddings."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest
from PIL import Image

from krea2.curate.distill import LabelTask, LinearHead, pseudo_label, train_head
from krea2.curate.vlm import VlmClient, VlmUnavailable

TASK = LabelTask("bright", "Is this image mostly bright?")


class FakeVlm(BaseHTTPRequestHandler):
    """A deterministic VLM behind /v1/chat/completions: it looks at the image and answers
    whether its mean grey level is above 128. ``mode`` makes it misbehave on purpose."""

    mode = "good"  # good | garbage-first | garbage | error-first
    seen: ClassVar[dict[str, int]] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        parts = body["messages"][-1]["content"]
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
        with self.lock:
            count = self.seen[url] = self.seen.get(url, 0) + 1
        if self.mode == "error-first" and count <= 2:
            return self._send(503, {"error": "overloaded"})
        label = "yes" if pixels.mean() > 128 else "no"
        answer = f'```json\n{{"label": "{label}"}}\n```'
        if self.mode == "garbage" or (self.mode == "garbage-first" and count <= 2):
            answer = "I think the image shows a picture."
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": answer}}]})

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[type[FakeVlm]]:
    handler = type("Vlm", (FakeVlm,), {"seen": {}, "mode": "good"})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"  # type: ignore[attr-defined]
    yield handler
    httpd.shutdown()
    httpd.server_close()


def images(n: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Textured images with a random brightness; truth = mean above 128."""
    rng = np.random.default_rng(seed)
    level = rng.uniform(40, 215, n)
    out = [np.clip(lv + rng.normal(0, 30, (24, 24, 3)), 0, 255).astype(np.uint8) for lv in level]
    return out, np.asarray([im.mean() > 128 for im in out])


def embed(ims: list[np.ndarray]) -> np.ndarray:
    """A fixed random projection of 6×6 thumbnails, unit norm (a stand-in embedder)."""
    thumbs = np.stack([im.reshape(6, 4, 6, 4, 3).mean((1, 3)).ravel() for im in ims]) / 255.0
    proj = np.random.default_rng(1).normal(size=(thumbs.shape[1], 32))
    x = np.c_[thumbs @ proj, np.ones(len(ims))]
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def client(server, **kw) -> VlmClient:
    return VlmClient(server.url, backoff_s=0.01, concurrency=4, **kw)


def test_pseudo_labels_distill_into_a_calibrated_head(server, tmp_path):
    ims, truth = images(300)
    labels = pseudo_label(client(server), ims, TASK)
    assert labels == ["yes" if t else "no" for t in truth]
    y = np.asarray([label == "yes" for label in labels], float)
    head, report = train_head("bright", embed(ims), y)
    assert report["held_out"] == 60 and report["held_out_positives"] > 10
    assert report["precision"] >= 0.9 and report["recall"] >= 0.9, report
    assert report["ece"] <= report["ece_uncalibrated"] + 0.05, report
    again = LinearHead.load(head.save(tmp_path / "head.json"))
    np.testing.assert_allclose(again.proba(embed(ims[:5])), head.proba(embed(ims[:5])))


def test_garbage_answers_are_asked_again(server):
    server.mode = "garbage-first"
    ims, truth = images(6)
    assert pseudo_label(client(server), ims, TASK) == ["yes" if t else "no" for t in truth]
    assert set(server.seen.values()) == {3}


def test_a_model_that_only_returns_garbage_fails_each_item_alone(server):
    server.mode = "garbage"
    out = pseudo_label(client(server), images(3)[0], TASK, garbage_retries=1)
    assert all(isinstance(e, ValueError) and "unusable answer after 2 tries" in str(e) for e in out)


def test_an_overloaded_server_is_retried_and_a_down_one_is_a_clear_error(server):
    server.mode = "error-first"
    ims, truth = images(4)
    assert pseudo_label(client(server), ims, TASK) == ["yes" if t else "no" for t in truth]
    down = VlmClient("http://127.0.0.1:9", retries=2, backoff_s=0.01, timeout_s=2)
    out = pseudo_label(down, ims[:2], TASK)
    assert all(isinstance(e, VlmUnavailable) for e in out)
    assert "gave no usable answer after 3 attempts" in str(out[0])


def test_label_parsing_takes_json_or_the_bare_label_and_nothing_else():
    assert TASK.parse('{"label": "YES"}') == "yes"
    assert TASK.parse('```json\n{"label": "no"}\n```') == "no"
    assert TASK.parse("No.") == "no"
    for bad in ("maybe", '{"label": "perhaps"}', "[1, 2]", ""):
        with pytest.raises(ValueError, match="is not one of"):
            TASK.parse(bad)


def test_too_few_labels_for_three_splits_is_a_clear_error():
    with pytest.raises(ValueError, match="label more images"):
        train_head("t", np.eye(10, dtype=np.float32), np.zeros(10))  # no positive at all
