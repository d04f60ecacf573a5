"""`krea2 expander serve` against hostile requests (issue #38, M5): a token off loopback,
bodies capped before they are read, message count and length and max_tokens capped, and a
long generation never stalls /health."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit

import httpx
import pytest

from krea2.expander.cli import app
from krea2.expander.server import ChatLimits, create_app
from krea2.infra.host import run_cli


class _Tokenizer:
    def __call__(self, text: str) -> dict:
        return {"input_ids": text.split()}


class _Echo:
    """An expander stand-in: expands a request to itself; ``hold`` blocks expansion until
    released (``entered`` is set once a generation is under way)."""

    def __init__(self, hold: bool = False) -> None:
        self.tokenizer = _Tokenizer()
        self.entered, self.release = threading.Event(), threading.Event()
        if not hold:
            self.release.set()

    def expand(self, requests, max_new_tokens=None, temperature=0.0):
        self.entered.set()
        assert self.release.wait(60), "the test never released the generation"
        return [("thinking", r) for r in requests]


def _chat(content: str = "a red circle", **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture(scope="module")
def server(serve):
    with serve(create_app(_Echo(), "toy", token="sesame")) as url:
        yield url


def _post(url: str, body, token: str | None = "sesame") -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_with_a_token_the_api_needs_it_and_health_stays_open(server):
    assert _post(server, _chat()).status_code == 200
    for token in (None, "wrong"):
        r = _post(server, _chat(), token)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    assert httpx.get(f"{server}/v1/models").status_code == 401
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_a_20_million_character_message_is_refused_before_it_is_read(server):
    # The probe's body, declared but never sent: a server that read it would never answer.
    size = len(b'{"messages": [{"role": "user", "content": ""}]}') + 20_000_000
    where = urlsplit(server)
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: Bearer sesame\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    with socket.create_connection((where.hostname, where.port), timeout=30) as s:
        s.sendall(request)
        status = s.recv(65536).split(b"\r\n", 1)[0]
    assert b" 413 " in status


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_chat("x" * 16_001), "messages.0.content: 16001 characters"),
        ({"messages": [{"role": "user", "content": "x"}] * 33}, "at most 32"),
        (_chat(max_tokens=1025), "max_tokens: 1025 is over this server's 1024"),
        (_chat(max_tokens=True), "max_tokens"),
    ],
    ids=["long-message", "many-messages", "max-tokens", "bool-max-tokens"],
)
def test_requests_over_the_limits_get_a_400_naming_the_limit(server, body, says):
    r = _post(server, body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"[" * 100_000, "nests deeper"), (b"[" + b"0," * 200_000 + b"0]", "more than")],
)
def test_json_too_deep_or_too_wide_is_a_400(server, content, says):
    headers = {"Authorization": "Bearer sesame", "Content-Type": "application/json"}
    r = httpx.post(f"{server}/v1/chat/completions", content=content, headers=headers)
    assert r.status_code == 400 and says in r.json()["error"]["message"]


def test_the_limits_are_the_servers_to_set(serve):
    limits = ChatLimits(max_body_bytes=200, max_tokens=8)
    with serve(create_app(_Echo(), "toy", limits=limits)) as url:
        assert _post(url, _chat("x" * 300), None).status_code == 413
        assert _post(url, _chat(max_tokens=9), None).status_code == 400
        assert _post(url, _chat(max_tokens=8), None).status_code == 200


def test_a_generation_under_way_does_not_stall_health(serve):
    echo = _Echo(hold=True)
    with serve(create_app(echo, "toy")) as url:
        answer: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: answer.append(_post(url, _chat(), None)))
        worker.start()
        try:
            assert echo.entered.wait(30), "the generation never started"
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        finally:
            echo.release.set()
            worker.join(30)
    assert answer[0].status_code == 200


def test_serve_refuses_a_public_host_without_a_token(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KREA2_EXPANDER_TOKEN", raising=False)
    # tmp_path holds no model: the refusal comes before any model is loaded
    assert run_cli(app, ["serve", str(tmp_path), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--token" in err and "KREA2_EXPANDER_TOKEN" in err and "no model here" not in err
