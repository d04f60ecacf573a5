"""An OpenAI-compatible chat endpoint for the expander (the transformers path).

vLLM serves the same API in production (`krea2 expander serve --vllm` starts it); this
server is the fallback with the same wire format, so clients never know which one runs:
``POST /v1/chat/completions`` (the expansion in ``message.content``, the thinking trace in
``message.reasoning_content``, as vLLM's reasoning parsers return it), ``GET /v1/models``,
``GET /health``. Malformed requests get a 4xx with an OpenAI-style error naming the field.

What a request may hold is capped (:class:`ChatLimits`): the body before it is read (413),
the messages and their length, and ``max_tokens`` (400). With a token, ``/v1/*`` needs
``Authorization: Bearer <token>`` (what OpenAI clients send as their API key); ``/health``
stays open for probes. Generation runs on a worker thread: a long one never stalls
``/health``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from krea2.expander.sft import generate
from krea2.expander.sft_data import SYSTEM_PROMPT, split_answer
from krea2.rl import BadJson, BodyTooLarge, load_json, read_body, token_matches

__all__ = ["TOKEN_ENV", "ChatLimits", "Expander", "create_app"]

TOKEN_ENV = "KREA2_EXPANDER_TOKEN"


@dataclass(frozen=True)
class ChatLimits:
    """What one chat request may hold: ``max_body_bytes`` (1 MiB; 413 beyond, refused before
    it is read), ``max_messages`` (32), ``max_message_chars`` per message (16,000; a long
    caption is ~2,000) and ``max_tokens`` to generate (1,024; an expansion is a few hundred)."""

    max_body_bytes: int = 2**20
    max_messages: int = 32
    max_message_chars: int = 16_000
    max_tokens: int = 1024


class Expander:
    """A loaded expander: ``expand(requests)`` -> [(thinking, expansion)]. Generation is
    serialised by a lock (one model, many server threads)."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 256) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_new_tokens = max_new_tokens
        self._lock = threading.Lock()

    def expand(
        self, requests: Sequence[str], max_new_tokens: int | None = None, temperature: float = 0.0
    ) -> list[tuple[str, str]]:
        sampling = {"temperature": temperature} if temperature > 0 else {}
        with self._lock:
            answers = generate(
                self.model, self.tokenizer, list(requests),
                max_new_tokens or self.max_new_tokens, **sampling,
            )  # fmt: skip
        return [split_answer(a) for a in answers]


class Message(BaseModel):
    model_config = ConfigDict(strict=True)  # no "1" for 1, no true for 1: JSON types as sent

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    n: int = Field(default=1, ge=1, le=1)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _over_limits(body: ChatRequest, limits: ChatLimits) -> str | None:
    """What in ``body`` is over ``limits`` (a 400's message), or None."""
    if len(body.messages) > limits.max_messages:
        return (
            f"messages: {len(body.messages)} messages; this server takes at most "
            f"{limits.max_messages}"
        )
    for i, m in enumerate(body.messages):
        if len(m.content) > limits.max_message_chars:
            return (
                f"messages.{i}.content: {len(m.content)} characters; this server takes at most "
                f"{limits.max_message_chars} per message"
            )
    if body.max_tokens is not None and body.max_tokens > limits.max_tokens:
        return f"max_tokens: {body.max_tokens} is over this server's {limits.max_tokens}"
    return None


def create_app(
    expander: Expander,
    model_name: str = "krea2-expander",
    *,
    token: str | None = None,
    limits: ChatLimits | None = None,
) -> FastAPI:
    """The FastAPI app serving ``expander`` under the OpenAI chat API; ``token``: the bearer
    token ``/v1/*`` requires (None: none), ``limits``: what one request may hold."""
    limits = limits or ChatLimits()
    app = FastAPI(title="krea2 expander")

    def refused(request: Request) -> JSONResponse | None:
        """401 unless the request carries the token (checked before its body is read)."""
        if token is None or token_matches(request.headers.get("authorization"), token):
            return None
        return _error(401, "missing or wrong API key (Authorization: Bearer <token>)",
                      "authentication_error")  # fmt: skip

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models", response_model=None)
    def models(request: Request) -> dict | JSONResponse:
        if (denied := refused(request)) is not None:
            return denied
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def complete(request: Request) -> dict | JSONResponse:
        if (denied := refused(request)) is not None:
            return denied
        try:
            body = ChatRequest.model_validate(
                load_json(await read_body(request, limits.max_body_bytes))
            )
        except BodyTooLarge as e:  # the rest of the body is never read: close the connection
            response = _error(413, str(e))
            response.headers["connection"] = "close"
            return response
        except BadJson as e:
            return _error(400, str(e))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return _error(400, f"{where or 'body'}: {first['msg']}")
        if (problem := _over_limits(body, limits)) is not None:
            return _error(400, problem)
        users = [m.content for m in body.messages if m.role == "user"]
        if not users or not users[-1].strip():
            return _error(400, "messages: needs a non-empty user message (the request to expand)")
        if body.model not in (None, model_name):
            return _error(404, f"model {body.model!r} is not served here; use {model_name!r}",
                          "model_not_found")  # fmt: skip
        return await run_in_threadpool(_completion, expander, model_name, users[-1], body)

    return app


def _completion(expander: Expander, model_name: str, request: str, body: ChatRequest) -> dict:
    """The chat completion expanding ``request`` (blocking: on a worker thread)."""
    [(thinking, expansion)] = expander.expand([request], body.max_tokens, body.temperature)
    prompt_tokens = len(expander.tokenizer(SYSTEM_PROMPT + request)["input_ids"])
    completion_tokens = len(expander.tokenizer(thinking + expansion)["input_ids"])
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": expansion,
                    "reasoning_content": thinking,
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
