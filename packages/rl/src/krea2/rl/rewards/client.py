"""The reward client: a :class:`Reward` that scores over HTTP on a reward server.

Retries connection failures, timeouts and 5xx answers with jittered exponential backoff.
Each request carries a ``request_id`` that its retries repeat, so a server that already
scored it answers from memory instead of scoring again; after a server restart the memory
is gone and the request is scored anew, which is harmless: rewards are pure functions of
(image, prompt), so the second score equals the first.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from krea2.rl.rewards.contract import RewardOutput, check_batch, empty_output
from krea2.rl.rewards.wire import BINARY_TYPE, decode_output, encode_binary, encode_images


class RewardServerError(ConnectionError):
    """The reward server could not be reached or kept failing after every retry."""


_RETRYABLE = (httpx.TransportError, httpx.TimeoutException)


class RewardClient:
    """Score ``images`` and ``prompts`` on the server at ``url`` (same contract, same scores
    as the reward in-process).

    ``timeout_s`` per HTTP attempt; ``retries`` further attempts after the first, waiting
    ``backoff_s · 2^k`` (capped at ``max_backoff_s``, times a random factor in [0.5, 1.5])
    between them; batches over ``max_images_per_request`` images or ``max_request_bytes`` of
    pixels (under the server's default 64 MiB body cap) go as several requests, framed in
    binary (``binary=False``: as JSON with base64 pixels, for servers before that). Bad input
    raises ValueError (checked here first, as in-process, and on 422 from the server); a
    wrong token raises PermissionError; exhausted retries raise :class:`RewardServerError`.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        name: str | None = None,
        timeout_s: float = 60.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        max_images_per_request: int = 64,
        max_request_bytes: int = 48 * 2**20,
        binary: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.name = name or f"remote:{self.url}"
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.max_images_per_request = max_images_per_request
        self.max_request_bytes = max_request_bytes
        self.binary = binary
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s)
        self.attempts = 0  # HTTP attempts made, retries included (for tests and logs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer (one attempt; raises httpx errors as they come)."""
        response = self._http.get(f"{self.url}/health")
        response.raise_for_status()
        return response.json()

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        if not prompts:
            return empty_output()
        per_image = max(1, pixels[0].nbytes * (3 if self.binary else 4) // 3)  # base64: 4/3
        step = max(1, min(self.max_images_per_request, self.max_request_bytes // per_image))
        parts = [
            self._post(pixels[i : i + step], prompts[i : i + step])
            for i in range(0, len(prompts), step)
        ]
        return RewardOutput.concat(parts)

    def _post(self, pixels: Any, prompts: list[str]) -> RewardOutput:
        request_id = uuid.uuid4().hex  # every retry repeats it
        if self.binary:
            content = encode_binary(pixels, prompts, request_id)
            body: dict[str, Any] = {"content": content, "headers": {"content-type": BINARY_TYPE}}
        else:
            images = encode_images(pixels)
            body = {"json": {"request_id": request_id, "prompts": prompts, "images": images}}
        last = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * random.uniform(0.5, 1.5))
            self.attempts += 1
            try:
                response = self._http.post(f"{self.url}/score", **body)
            except _RETRYABLE as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if response.status_code == 200:
                return decode_output(response.json())
            detail = _detail(response)
            if response.status_code == 401:
                raise PermissionError(f"reward server {self.url} refused the token: {detail}")
            if response.status_code < 500:
                raise ValueError(f"reward server {self.url} rejected the request: {detail}")
            last = f"HTTP {response.status_code}: {detail}"
        raise RewardServerError(
            f"reward server {self.url} did not answer after {self.retries + 1} attempts "
            f"(last: {last}); is it running? start one with: krea2 rl serve-reward --kind ..."
        )


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:200]
