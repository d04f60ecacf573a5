"""`krea2 dit serve` as a process: SIGTERM finishes what it accepted, then exits; the
command's help and its refusals before any weights load."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from dit_test_helpers import GEN
from dit_test_helpers import send as send_async

from krea2.dit.cli import app
from krea2.infra.host import run_cli
from krea2.infra.pause import pause_env, wait_for_pause

KREA2 = str(Path(sys.executable).parent / "krea2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command(folder: Path) -> tuple[list[str], str]:
    """`krea2 dit serve` of ``folder`` on a free loopback port, batches taken at once; the
    command and the server's URL."""
    port = _free_port()
    cmd = [KREA2, "dit", "serve", "--model", str(folder), "--port", str(port),
           "--size", "32x32", "--text-tokens", "16", "--device", "cpu",
           "--batch-wait-ms", "0"]  # fmt: skip
    return cmd, f"http://127.0.0.1:{port}"


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(url + "/health", timeout=1).json()["ready"]:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError("the server never became ready")


def test_sigterm_stops_accepting_and_answers_every_accepted_request(serving_folder, tmp_path):
    cmd, url = _serve_command(serving_folder)
    notice = tmp_path / "paused"
    # The server holds its first batch at a pause point until SIGTERM: the signal lands
    # with that request being sampled and a second one queued behind it, on any machine.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **pause_env("image batches", 0, notice)}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    results: dict[str, httpx.Response | Exception] = {}

    def send(key: str, body: dict) -> threading.Thread:
        return send_async(url, results, key, body)

    try:
        _wait_healthy(url, proc)
        sampling = send("sampling", {"prompt": "a red circle", "steps": 2, "seed": 1})
        wait_for_pause(notice, proc, timeout_s=60)
        queued = send("queued", {"prompt": "a blue square", "size": "16x16", "steps": 2})
        deadline = time.monotonic() + 60
        while httpx.get(url + "/health").json()["queued_images"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        late = []  # after SIGTERM: refused at the socket, or a 503 while it drains
        for _ in range(50):
            try:
                r = httpx.post(url + GEN, json={"prompt": "x", "steps": 1}, timeout=30)
            except httpx.TransportError:
                late.append("refused")
                break
            late.append(r.status_code)
            time.sleep(0.02)
        sampling.join(timeout=120), queued.join(timeout=120)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert late and set(late) <= {503, "refused"}, late
    for key in ("sampling", "queued"):
        r = results[key]
        assert isinstance(r, httpx.Response) and r.status_code == 200, (key, r)
        assert len(r.json()["data"]) == 1
    assert proc.returncode == 143 and "terminated" in stderr, stderr


def test_sigkill_mid_batch_errors_every_accepted_client_and_a_restart_serves_them(
    serving_folder, tmp_path
):
    """A killed server loses no accepted request silently: the request being sampled and
    the one queued behind it each get a transport error (not a hang, not a 200 without
    images); the same command started again answers both."""
    cmd, url = _serve_command(serving_folder)
    notice = tmp_path / "paused"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    bodies = {"sampling": {"prompt": "a red circle", "steps": 2, "seed": 1},
              "queued": {"prompt": "a blue square", "size": "16x16", "steps": 2}}  # fmt: skip
    results: dict[str, httpx.Response | Exception] = {}

    def send(key: str) -> threading.Thread:
        return send_async(url, results, key, bodies[key], timeout=60)

    proc = subprocess.Popen(cmd, env=env | pause_env("image batches", 0, notice),
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_healthy(url, proc)
        sampling = send("sampling")
        wait_for_pause(notice, proc, timeout_s=60)
        queued = send("queued")
        deadline = time.monotonic() + 60
        while httpx.get(url + "/health").json()["queued_images"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no drain, no goodbye
        proc.wait(timeout=30)
        sampling.join(timeout=90), queued.join(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    for key in bodies:
        error = results[key]
        assert isinstance(error, httpx.TransportError), (key, error)
        assert not isinstance(error, httpx.TimeoutException), (key, error)  # told, not left
    again = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_healthy(url, again)
        for key, body in bodies.items():
            r = httpx.post(url + GEN, json=body, timeout=120)
            assert r.status_code == 200 and len(r.json()["data"]) == 1, (key, r.text)
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=120)


def test_help_shows_the_api_and_an_example(capsys):
    with pytest.raises(SystemExit):
        app(["serve", "--help"])
    out = capsys.readouterr().out
    assert "/v1/images/generations" in out and "Example: krea2 dit serve --model" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--host", "0.0.0.0"], "exposes the image server beyond this machine"),
        (["--size", "36x36"], "--size 36x36: width and height must be multiples of 8"),
        (["--max-batch", "0"], "--max-batch 0 must be >= 1"),
        (["--lora", "maroon"], "write NAME=PATH"),
        (["--lora", "maroon=missing.safetensors"], "missing.safetensors does not exist"),
        (["--quant", "float8"], "needs a CUDA GPU"),
        (["--quant", "int4"], "choose one of none, int8, float8"),
    ],
)
def test_mistakes_are_one_line_before_the_weights_load(serving_folder, capsys, args, says):
    assert run_cli(app, ["serve", "--model", str(serving_folder), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_missing_serve_extra_names_the_install(serving_folder, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    assert run_cli(app, ["serve", "--model", str(serving_folder)]) == 2
    assert "pip install 'krea2-dit[serve]'" in capsys.readouterr().err
