"""A client for OpenAI-compatible chat servers (vLLM in production): retries, a rate limit,
concurrent batches, and answers checked before they are trusted.

``VlmClient.chat(messages)`` posts to ``{base_url}/v1/chat/completions`` and returns the
first choice's text. Connection errors, timeouts, HTTP 429 and 5xx are retried with
jittered exponential backoff; any other HTTP error fails at once with the server's message.
``ask_many`` runs many requests ``concurrency`` at a time, no faster than ``max_rps``, and
returns one text or one exception per request, in order, so one bad item never loses the
others. ``ask_checked`` also asks again when ``parse`` rejects an answer (a model that
returns garbage), up to ``garbage_retries`` times.
"""

from __future__ import annotations

import base64
import io
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
Messages = list[dict[str, Any]]


class VlmUnavailable(ConnectionError):
    """The server did not answer (down, timing out, overloaded) after every retry."""


def image_part(pixels: np.ndarray) -> dict[str, Any]:
    """(h, w, 3) uint8 RGB → an OpenAI ``image_url`` content part (PNG data URL)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.asarray(pixels, np.uint8)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def image_question(pixels: np.ndarray, question: str, system: str | None = None) -> Messages:
    """The messages of one question about one image."""
    content = [image_part(pixels), {"type": "text", "text": question}]
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": content}]


class RateLimit:
    """At most ``per_s`` starts per second across threads (None: unlimited)."""

    def __init__(self, per_s: float | None) -> None:
        self.gap = 1.0 / per_s if per_s else 0.0
        self.next = 0.0
        self.lock = threading.Lock()

    def wait(self) -> None:
        if not self.gap:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next)
            self.next = start + self.gap
        time.sleep(max(0.0, start - now))


class VlmClient:
    """An OpenAI-compatible chat client; greedy (temperature 0) so labels are reproducible."""

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_rps: float | None = None,
        concurrency: int = 4,
        max_tokens: int = 128,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model, self.retries, self.backoff_s = model, retries, backoff_s
        self.concurrency, self.max_tokens = concurrency, max_tokens
        self.limit = RateLimit(max_rps)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s)

    def chat(self, messages: Messages, **params: Any) -> str:
        """The first choice's text; ``VlmUnavailable`` after ``retries`` retries. ``params``
        override request fields (e.g. ``max_tokens=4`` for a one-word verdict)."""
        import httpx

        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            **params,
        }
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                pause = min(10.0, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(pause * random.uniform(0.5, 1.5))
            self.limit.wait()
            try:
                r = self._http.post(f"{self.base_url}/v1/chat/completions", json=body)
            except httpx.HTTPError as exc:  # refused, reset, timed out
                last = f"{type(exc).__name__}: {exc}"
                continue
            if r.status_code == 429 or r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code != 200:
                raise RuntimeError(f"{self.base_url} answered HTTP {r.status_code}: {r.text[:300]}")
            try:
                return str(r.json()["choices"][0]["message"]["content"])
            except (ValueError, KeyError, IndexError, TypeError):
                last = f"not an OpenAI chat response: {r.text[:200]!r}"
        raise VlmUnavailable(
            f"VLM server {self.base_url} gave no usable answer after {self.retries + 1} "
            f"attempts (last: {last}); check that it is up and serves /v1/chat/completions"
        )

    def ask_checked(self, messages: Messages, parse: Callable[[str], T], garbage_retries: int) -> T:
        """``parse(chat(messages))``; a ``ValueError`` from ``parse`` (garbage) asks again,
        at most ``garbage_retries`` more times, then is raised with the last answer."""
        for attempt in range(garbage_retries + 1):
            answer = self.chat(messages)
            try:
                return parse(answer)
            except ValueError as exc:
                if attempt == garbage_retries:
                    raise ValueError(f"unusable answer after {attempt + 1} tries: {exc}") from None
        raise AssertionError("unreachable")

    def ask_many(
        self,
        requests: Sequence[Messages],
        parse: Callable[[str], T] = str,  # type: ignore[assignment]
        garbage_retries: int = 2,
    ) -> list[T | Exception]:
        """One parsed answer or one exception per request, in order, ``concurrency`` at a
        time."""

        def one(messages: Messages) -> T | Exception:
            try:
                return self.ask_checked(messages, parse, garbage_retries)
            except (ValueError, RuntimeError, ConnectionError) as exc:
                return exc

        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="vlm") as pool:
            return list(pool.map(one, requests))

    def close(self) -> None:
        self._http.close()
