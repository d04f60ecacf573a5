"""A minimal client for OpenAI-compatible chat servers (vLLM, or any ``/v1/chat/completions``)."""

from __future__ import annotations

import base64
import io
import random
import time
from typing import Any

import httpx
import numpy as np
from PIL import Image


def image_part(pixels: np.ndarray) -> dict[str, Any]:
    """A uint8 ``[H, W, 3]`` image as an OpenAI ``image_url`` content part (PNG data URL)."""
    buf = io.BytesIO()
    Image.fromarray(np.asarray(pixels, np.uint8)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


class OpenAICompatibleClient:
    """``chat(messages) -> str``: the first choice's text from ``{base_url}/v1/chat/completions``.

    Greedy by default (``temperature=0``) so answers, and so rewards, are reproducible.
    Connection errors, timeouts and 5xx are retried ``retries`` times with jittered backoff;
    other errors raise RuntimeError with the server's message.
    """

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int = 3,
        max_tokens: int = 256,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model, self.retries, self.max_tokens = model, retries, max_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s)

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> str:
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
                time.sleep(min(5.0, 0.2 * 2**attempt) * random.uniform(0.5, 1.5))
            try:
                response = self._http.post(f"{self.base_url}/v1/chat/completions", json=body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code != 200:
                raise RuntimeError(
                    f"{self.base_url} answered HTTP {response.status_code}: {response.text[:300]}"
                )
            return str(response.json()["choices"][0]["message"]["content"])
        raise ConnectionError(
            f"chat server {self.base_url} did not answer after {self.retries + 1} attempts "
            f"(last: {last})"
        )

    def close(self) -> None:
        self._http.close()
