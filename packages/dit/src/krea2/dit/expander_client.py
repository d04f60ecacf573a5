"""A prompt through a prompt expander: one request to an OpenAI-compatible chat endpoint.

The expander is `krea2 expander serve` or vLLM serving an expander checkpoint. Only the
standard library speaks to it (krea2.dit cannot import krea2.expander, which is downstream),
the same wire as `krea2.trainer.expand_client`. Every failure is an :class:`ExpanderError`
naming the endpoint: a refused or timed-out connection, an HTTP error with the server's
message, a reply without a chat completion or with an empty one.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from krea2.infra.errors import UserError

__all__ = ["EXPANDER_TOKEN_ENV", "ExpanderError", "expand_prompt"]

EXPANDER_TOKEN_ENV = "KREA2_EXPANDER_TOKEN"  # the API key `krea2 expander serve --token` reads


class ExpanderError(UserError):
    """The expander could not expand a prompt (the message says why and where)."""


def expand_prompt(
    base_url: str,
    prompt: str,
    model: str | None = None,
    max_tokens: int = 256,
    timeout_s: float = 30.0,
    token: str | None = None,
) -> str:
    """The greedy expansion of ``prompt`` by the chat endpoint at ``base_url`` (``.../v1``):
    the reply's ``content`` (a reasoning trace is the separate ``reasoning_content``).
    ``timeout_s`` bounds the connection and each read; ``token`` (default
    ``$KREA2_EXPANDER_TOKEN``) is sent as the bearer API key."""
    url = base_url.rstrip("/") + "/chat/completions"
    token = token if token is not None else os.environ.get(EXPANDER_TOKEN_ENV) or None
    body: dict = {"messages": [{"role": "user", "content": prompt}], "temperature": 0.0,
                  "max_tokens": max_tokens}  # fmt: skip
    if model:
        body["model"] = model
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read()).get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            detail = ""
        raise ExpanderError(
            f"the expander at {url} answered {e.code}: {detail or e.reason}"
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            raise ExpanderError(
                f"the expander at {url} did not answer within {timeout_s:g} s (timed out)"
            ) from None
        raise ExpanderError(
            f"the expander at {url} is not reachable ({reason}); start one with "
            "`krea2 expander serve DIR` or pass the URL of a running one"
        ) from None
    except ValueError as e:  # a body that is not JSON
        raise ExpanderError(f"the expander at {url} sent a reply that is not JSON ({e})") from None
    try:
        text = str(reply["choices"][0]["message"]["content"] or "").strip()
    except (KeyError, IndexError, TypeError):
        raise ExpanderError(
            f"the expander at {url} sent no chat completion: {reply!r:.200}"
        ) from None
    if not text:
        raise ExpanderError(f"the expander at {url} expanded {prompt!r:.80} to nothing")
    return text
