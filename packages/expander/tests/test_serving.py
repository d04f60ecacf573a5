"""`krea2 expander serve`'s OpenAI-compatible API on loopback, and the CLI's commands."""

from __future__ import annotations

import json

import httpx
import pytest

from krea2.expander.cli import app
from krea2.expander.server import Expander, create_app
from krea2.expander.toy_model import ToyModelConfig, load_model, tiny_qwen3, train_tokenizer
from krea2.infra.host import run_cli


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny (untrained) expander saved as `krea2 expander sft` saves one."""
    out = tmp_path_factory.mktemp("expander")
    tok = train_tokenizer(["a red circle in the top left", "<think>", "</think>"], 300)
    size = ToyModelConfig(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    tiny_qwen3(tok, size).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(model_dir, serve):
    model, tok = load_model(model_dir)
    with serve(create_app(Expander(model, tok, max_new_tokens=8), "toy")) as url:
        yield url


def test_a_chat_completion_has_the_openai_shape_with_the_trace_apart(server):
    body = {"model": "toy", "messages": [{"role": "user", "content": "a red circle"}]}
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion" and data["model"] == "toy"
    message = data["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert "reasoning_content" in message
    assert data["usage"]["total_tokens"] == (
        data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"]
    )
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["id"] == "toy"
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, "non-empty user message"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "gpt"}, 404, "not served"),
        ({"prompt": "x"}, 400, "messages"),
    ],
)
def test_malformed_requests_get_a_4xx_naming_the_problem(server, body, status, says):
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]


def test_a_body_that_is_not_json_is_refused(server):
    r = httpx.post(
        f"{server}/v1/chat/completions", content=b"{nope",
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert r.status_code == 400 and "error" in r.json()


def test_the_cli_writes_data_and_expands_and_names_bad_input(model_dir, tmp_path, capsys):
    chats = tmp_path / "chats.jsonl"
    assert run_cli(app, ["sft-data", "--scenes", "5", "--out", str(chats), "--rich", "1"]) == 0
    rows = [json.loads(line) for line in chats.read_text().splitlines()]
    assert len(rows) == 5 and rows[0]["messages"][2]["role"] == "assistant"
    assert run_cli(app, ["expand", "a red circle", "--model", str(model_dir), "--thinking"]) == 0
    out = capsys.readouterr()
    assert "thinking:" in out.err
    assert run_cli(app, ["expand", " ", "--model", str(model_dir)]) == 2
    assert run_cli(app, ["expand", "x", "--model", str(tmp_path)]) == 2
    assert "no model here" in capsys.readouterr().err
    assert run_cli(app, ["sft", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 2
    assert run_cli(app, ["sft-data", "--out", str(chats)]) == 2
