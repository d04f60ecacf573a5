"""An OpenAI-compatible chat endpoint for the expander (the transformers path).

vLLM serves the same API in production (`krea2 expander serve --vllm` starts it); this
server is the fallback with the same wire format, so clients never know which one runs:
``POST /v1/chat/completions`` (the expansion in ``message.content``, the thinking trace in
``message.reasoning_content``, as vLLM's reasoning parsers return it), ``GET /v1/models``,
``GET /health``. Malformed requests get a 4xx with an OpenAI-style error naming the field.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from krea2.expander.sft import generate
from krea2.expander.sft_data import SYSTEM_PROMPT, split_answer

__all__ = ["Expander", "create_app"]


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
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(BaseModel):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    n: int = Field(default=1, ge=1, le=1)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def create_app(expander: Expander, model_name: str = "krea2-expander") -> FastAPI:
    """The FastAPI app serving ``expander`` under the OpenAI chat API."""
    app = FastAPI(title="krea2 expander")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        return _error(400, f"{where or 'body'}: {first['msg']}")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.post("/v1/chat/completions", response_model=None)
    def complete(body: ChatRequest) -> dict | JSONResponse:
        users = [m.content for m in body.messages if m.role == "user"]
        if not users or not users[-1].strip():
            return _error(400, "messages: needs a non-empty user message (the request to expand)")
        if body.model not in (None, model_name):
            return _error(404, f"model {body.model!r} is not served here; use {model_name!r}",
                          "model_not_found")  # fmt: skip
        [(thinking, expansion)] = expander.expand([users[-1]], body.max_tokens, body.temperature)
        prompt_tokens = len(expander.tokenizer(SYSTEM_PROMPT + users[-1])["input_ids"])
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

    return app
