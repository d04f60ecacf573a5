"""`krea2 train sample --expander URL`: prompts go through a served expander first."""

from __future__ import annotations

import httpx
import pytest

from krea2.expander.server import Expander, create_app
from krea2.expander.toy_model import SPECIAL_TOKENS, ToyModelConfig, tiny_qwen3, train_tokenizer
from krea2.infra.errors import UserError
from krea2.infra.host import run_cli
from krea2.trainer import expand_prompts


def toy_expander() -> Expander:
    """An untrained toy expander that always writes 8 visible tokens (special and blank
    tokens suppressed: no end of turn, no think block, so the whole answer is the
    expansion)."""
    tok = train_tokenizer(["a red circle in the top left", "<think>", "</think>"], 300)
    size = ToyModelConfig(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    model = tiny_qwen3(tok, size)
    blank = [i for i in range(len(tok)) if not tok.decode([i]).strip()]
    model.generation_config.suppress_tokens = [
        *tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)), *blank,
    ]  # fmt: skip
    return Expander(model, tok, max_new_tokens=8)


@pytest.fixture(scope="module")
def served(serve):
    with serve(create_app(toy_expander(), "toy")) as url:
        yield f"{url}/v1"


def test_prompts_come_back_as_the_servers_expansions(served):
    got = expand_prompts(served, ["a red circle", "a blue square"], max_tokens=8)
    want = [
        httpx.post(f"{served}/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": p}], "max_tokens": 8,
        }).json()["choices"][0]["message"]["content"]
        for p in ("a red circle", "a blue square")
    ]  # fmt: skip
    assert got == [w.strip() for w in want] and all(got)


def test_a_dead_or_refusing_expander_is_a_clear_error(served):
    with pytest.raises(UserError, match="not reachable"):
        expand_prompts("http://127.0.0.1:9/v1", ["a red circle"], timeout_s=5)
    with pytest.raises(UserError, match="answered 404: model 'gpt' is not served here"):
        expand_prompts(served, ["a red circle"], model="gpt")
    with pytest.raises(UserError, match="answered 400"):
        expand_prompts(served, ["   "])


def test_the_sampler_checks_its_run_before_asking_the_expander(tmp_path, capsys):
    from krea2.trainer.cli import app

    code = run_cli(
        app,
        ["sample", str(tmp_path / "nope"), "-p", "a red circle", "--out",
         str(tmp_path / "o"), "--expander", "http://127.0.0.1:9/v1"],
    )  # fmt: skip
    assert code == 2
    assert "has no config.toml" in capsys.readouterr().err


def test_a_token_protected_expander_gets_the_key_from_the_environment(serve, monkeypatch):
    with serve(create_app(toy_expander(), "toy", token="s3cret")) as url:
        monkeypatch.delenv("KREA2_EXPANDER_TOKEN", raising=False)
        with pytest.raises(UserError, match="answered 401"):
            expand_prompts(f"{url}/v1", ["a red circle"], max_tokens=8)
        monkeypatch.setenv("KREA2_EXPANDER_TOKEN", "s3cret")
        assert all(expand_prompts(f"{url}/v1", ["a red circle"], max_tokens=8))
