"""Reward servers: same scores as in-process, batching, bad input, retries, kill and restart."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from krea2.curate import shapes
from krea2.infra.pause import pause_env, wait_for_pause
from krea2.rl.rewards import (
    RewardClient,
    RewardOutput,
    RewardServerError,
    ServerConfig,
    ServerThread,
    ShapesRubricReward,
)
from krea2.rl.rewards.wire import BINARY_TYPE, encode_images


def _batch(n: int, seed: int = 0, size: int = 48):
    rng = np.random.default_rng(seed)
    scenes = [shapes.sample_scene(rng) for _ in range(n)]
    images = np.stack([shapes.render(s, size, size) for s in scenes])
    return images, [shapes.captions(s)["medium"] for s in scenes]


class _Counting:
    """Wraps a reward; records every batch size it is called with; sleeps ``delays`` first."""

    def __init__(self, inner, delays=()):
        self.inner, self.name, self.calls = inner, inner.name, []
        self.delays = list(delays)

    def __call__(self, images, prompts):
        self.calls.append(len(prompts))
        if self.delays:
            time.sleep(self.delays.pop(0))  # the workload: a slow reward, never signalled
        return self.inner(images, prompts)


def _same(a: RewardOutput, b: RewardOutput) -> None:
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.sub_scores.keys() == b.sub_scores.keys()
    for k in a.sub_scores:
        np.testing.assert_array_equal(a.sub_scores[k], b.sub_scores[k])  # NaN == NaN here


@pytest.fixture(scope="module")
def rubric():
    return ShapesRubricReward(ocr=False)


@pytest.fixture(scope="module")
def counting(rubric):
    return _Counting(rubric)


@pytest.fixture(scope="module")
def server(counting):
    with ServerThread(counting, config=ServerConfig(token="secret")) as srv:
        yield srv


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_client_gives_the_same_scores_as_the_reward_in_process(server, rubric, binary):
    images, prompts = _batch(10)
    with RewardClient(server.url, "secret", max_images_per_request=4, binary=binary) as client:
        _same(client(images, prompts), rubric(images, prompts))
        floats = images.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1
        _same(client(floats, prompts), rubric(images, prompts))
        assert len(client(images[:0], [])) == 0


def test_concurrent_requests_are_batched_into_one_reward_call():
    images, prompts = _batch(8)
    reward = _Counting(ShapesRubricReward(ocr=False))
    config = ServerConfig(max_batch=8, max_wait_ms=2000)
    with ServerThread(reward, config=config) as srv:
        results = [None] * 8

        def one(i):
            with RewardClient(srv.url) as c:
                results[i] = c(images[i : i + 1], prompts[i : i + 1])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = httpx.get(f"{srv.url}/metrics").text
    assert reward.calls == [8]  # eight requests, one call: max_batch filled before the wait
    _same(RewardOutput.concat(results), reward.inner(images, prompts))
    assert 'krea2_rl_reward_requests_total{reward="rubric-shapes",status="200"}' in metrics


def test_health_reports_the_reward_and_its_batching(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["reward"] == "rubric-shapes"
    assert health["max_batch"] == 32


def _post(server, body, token="secret"):
    return httpx.post(
        f"{server.url}/score", json=body, headers={"Authorization": f"Bearer {token}"}
    )


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompts": ["a red circle"], "png": ["bm90IGFuIGltYWdl"]}, 422, "cannot be decoded"),
        (
            {"prompts": ["x"], "images": {"shape": [1, 4, 4, 3], "data": "AAAA"}},
            422,
            "bytes but shape",
        ),
        ({"prompts": ["x"], "images": {"shape": [1, 4, 4], "data": ""}}, 422, "[B, H, W, 3]"),
        ({"images": encode_images(np.zeros((1, 4, 4, 3), np.uint8))}, 422, 'missing "prompts"'),
        (
            {"prompts": [" "], "images": encode_images(np.zeros((1, 4, 4, 3), np.uint8))},
            422,
            "prompt 0 is empty",
        ),
        (
            {"prompts": ["a", "b"], "images": encode_images(np.zeros((1, 4, 4, 3), np.uint8))},
            422,
            "1 images but 2 prompts",
        ),
    ],
)
def test_bad_input_gets_a_4xx_with_a_clear_message(server, body, status, message):
    response = _post(server, body)
    assert response.status_code == status
    assert message in response.json()["detail"]


def _binary(header: bytes, pixels: bytes = b"") -> bytes:
    return len(header).to_bytes(4, "big") + header + pixels


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x00\x00", "too short"),
        (_binary(b'{"prompts": ["x"]}')[:10], "too short"),
        (_binary(b"not json"), "header is not UTF-8 JSON"),
        (_binary(b'{"prompts": ["x"]}'), '"request_id", "prompts", "shape"'),
        (_binary(b'{"shape": [1, 2, 2, 3]}', bytes(12)), 'missing "prompts"'),
        (_binary(b'{"prompts": ["x"], "shape": [1, 2, 2]}'), "[B, H, W, 3]"),
        (_binary(b'{"prompts": ["x"], "shape": [1, 2, 2, 3]}', bytes(5)), "5 bytes but shape"),
        (_binary(b'{"prompts": ["x", "y"], "shape": [1, 2, 2, 3]}', bytes(12)), "2 prompts"),
    ],
)
def test_bad_binary_input_gets_a_422_with_a_clear_message(server, body, message):
    response = httpx.post(
        f"{server.url}/score",
        content=body,
        headers={"Authorization": "Bearer secret", "Content-Type": BINARY_TYPE},
    )
    assert response.status_code == 422
    assert message in response.json()["detail"]


def test_a_png_request_scores_like_raw_pixels(server, rubric):
    import io

    from PIL import Image

    images, prompts = _batch(2)
    files = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        files.append(base64.b64encode(buf.getvalue()).decode())
    response = _post(server, {"prompts": prompts, "png": files})
    assert response.status_code == 200
    np.testing.assert_array_equal(response.json()["scores"], rubric(images, prompts).scores)


def test_not_json_and_wrong_token_are_refused(server):
    raw = httpx.post(
        f"{server.url}/score", content=b"\x00garbage", headers={"Authorization": "Bearer secret"}
    )
    assert raw.status_code == 400 and "not JSON" in raw.json()["detail"]
    assert _post(server, {}, token="wrong").status_code == 401
    images, prompts = _batch(1)
    with pytest.raises(PermissionError, match="refused the token"):
        RewardClient(server.url, "wrong")(images, prompts)


def test_the_client_checks_input_like_the_reward_in_process(server):
    images, _ = _batch(2)
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        RewardClient(server.url, "secret")(images, ["one"])


def test_a_repeated_request_id_is_answered_without_scoring_again(server, counting):
    images, prompts = _batch(3, seed=5)
    body = {"request_id": "same-id", "prompts": prompts, "images": encode_images(images)}
    before = len(counting.calls)
    first, second = _post(server, body).json(), _post(server, body).json()
    assert first == second
    assert len(counting.calls) == before + 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_down_server_raises_a_clear_error_after_the_retries():
    images, prompts = _batch(1)
    client = RewardClient(f"http://127.0.0.1:{_free_port()}", retries=2, backoff_s=0.01)
    with pytest.raises(RewardServerError, match="did not answer after 3 attempts"):
        client(images, prompts)
    assert client.attempts == 3


def test_a_slow_server_times_out_then_the_retry_gets_the_first_attempts_result():
    images, prompts = _batch(2)
    reward = _Counting(ShapesRubricReward(ocr=False), delays=[1.5])
    with ServerThread(reward, config=ServerConfig(max_wait_ms=0)) as srv:
        client = RewardClient(srv.url, timeout_s=0.5, retries=6, backoff_s=0.3)
        out = client(images, prompts)
    assert client.attempts >= 2  # the first attempt timed out
    assert reward.calls == [2]  # ... yet the batch was scored once
    _same(out, reward.inner(images, prompts))


def _start_server(port: int, pause: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "krea2.rl.rewards.cli", "serve-reward", "--kind", "rubric"]
    env = {**os.environ, "KREA2_REWARD_TOKEN": "tok", **(pause or {})}
    return subprocess.Popen([*cmd, "--port", str(port)], env=env, stderr=subprocess.DEVNULL)


def test_killing_and_restarting_the_server_mid_run_loses_no_request_and_keeps_scores(
    tmp_path: Path,
):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    images, prompts = _batch(24, seed=3)
    expected = ShapesRubricReward(ocr=False)(images, prompts)
    # The server holds its 7th batch (6 answered) at a pause point until the SIGKILL: the
    # kill lands with that request received and unanswered, on any machine.
    notice = tmp_path / "paused"
    proc = _start_server(port, pause_env("reward batches", 6, notice))
    results: dict[int, RewardOutput] = {}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with RewardClient(url, "tok", retries=12, backoff_s=0.2, max_backoff_s=2.0) as c:
                for i in range(len(prompts)):  # one request at a time: a batch each
                    results[i] = c(images[i : i + 1], prompts[i : i + 1])
        except BaseException as e:  # reported below
            errors.append(e)

    try:
        worker = threading.Thread(target=run)
        worker.start()
        try:
            wait_for_pause(notice, proc, timeout_s=120)
        except RuntimeError as e:
            raise AssertionError(f"{e}; the client's errors: {errors}") from None
        answered = sorted(results)  # held: the 7th request waits for its answer
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = _start_server(port)  # no pause point: it serves the rest
        worker.join(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert not errors, errors
    assert answered == list(range(6))  # killed mid-run, with request 6 in flight
    assert sorted(results) == list(range(len(prompts)))  # every request answered once
    _same(RewardOutput.concat([results[i] for i in range(len(prompts))]), expected)
