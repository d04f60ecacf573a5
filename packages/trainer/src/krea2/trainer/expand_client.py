"""Prompts through a prompt expander before sampling (`krea2 train sample --expander URL`).

The expander is any OpenAI-compatible chat endpoint: `krea2 expander serve` or vLLM serving
an expander checkpoint; one request per prompt by :func:`krea2.dit.expand_prompt` (the
standard library's client `krea2 dit serve` uses too), so the trainer needs no client
package and no import of krea2.expander (which depends on the trainer).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TOKEN_ENV", "expand_prompts"]

TOKEN_ENV = "KREA2_EXPANDER_TOKEN"  # the API key `krea2 expander serve --token` reads too


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
    from krea2.dit import expand_prompt

    return [expand_prompt(base_url, p, model, max_tokens, timeout_s, token) for p in prompts]
