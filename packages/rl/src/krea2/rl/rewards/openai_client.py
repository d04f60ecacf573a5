"""The rubric reward's client for OpenAI-compatible chat servers (vLLM, or any
``/v1/chat/completions``): curate's :class:`~krea2.curate.VlmClient` (retries with
backoff, rate limit), with the rubric's defaults and a plain ``ConnectionError``."""

from __future__ import annotations

from typing import Any

from krea2.curate import VlmClient, VlmUnavailable, image_part

__all__ = ["OpenAICompatibleClient", "image_part"]


class OpenAICompatibleClient(VlmClient):
    """``chat(messages, **params) -> str``, greedy so answers, and so rewards, are
    reproducible. Connection errors, timeouts, 429 and 5xx are retried ``retries`` times
    with jittered backoff; other HTTP errors raise RuntimeError with the server's message.
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
        super().__init__(
            base_url, model, api_key, timeout_s=timeout_s, retries=retries, max_tokens=max_tokens
        )

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> str:
        try:
            return super().chat(messages, **params)
        except VlmUnavailable as e:
            raise ConnectionError(
                f"chat server {self.base_url} did not answer after {self.retries + 1} attempts "
                f"({e})"
            ) from None
