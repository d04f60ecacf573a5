"""Prompts through a prompt expander before sampling (`krea2 train sample --expander URL`).

The expander is any OpenAI-compatible chat endpoint: `krea2 expander serve` or vLLM serving
an expander checkpoint. Only the standard library speaks to it, so the trainer needs no
client package and no import of krea2.expander (which depends on the trainer).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence

from krea2.infra.errors import UserError

__all__ = ["TOKEN_ENV", "expand_prompts"]

TOKEN_ENV = "KREA2_EXPANDER_TOKEN"  # the API key `krea2 expander serve --token` reads too


def _post(url: str, body: dict, timeout_s: float, token: str | None) -> dict:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read()).get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            detail = ""
        raise UserError(f"expander at {url} answered {e.code}: {detail or e.reason}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(
            f"expander at {url} is not reachable ({reason}); start one with "
            "`krea2 expander serve DIR` or pass the URL of a running one"
        ) from None


def expand_prompts(
    base_url: str,
    prompts: Sequence[str],
    model: str | None = None,
    max_tokens: int = 256,
    timeout_s: float = 120.0,
    token: str | None = None,
) -> list[str]:
    """Each prompt's greedy expansion from the chat endpoint at ``base_url`` (``.../v1``):
    the reply's ``content`` (a reasoning trace, if any, is the separate
    ``reasoning_content``). An empty reply or a dead server is a `UserError`. ``token``
    (default ``$KREA2_EXPANDER_TOKEN``) is sent as the bearer API key."""
    url = base_url.rstrip("/") + "/chat/completions"
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    out = []
    for prompt in prompts:
        body: dict = {"messages": [{"role": "user", "content": prompt}], "temperature": 0.0,
                      "max_tokens": max_tokens}  # fmt: skip
        if model:
            body["model"] = model
        reply = _post(url, body, timeout_s, token)
        try:
            text = str(reply["choices"][0]["message"]["content"] or "").strip()
        except (KeyError, IndexError, TypeError):
            raise UserError(f"expander at {url} sent no chat completion: {reply!r:.200}") from None
        if not text:
            raise UserError(f"expander at {url} expanded {prompt!r} to nothing")
        out.append(text)
    return out
