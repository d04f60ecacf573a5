"""What every krea2 HTTP server checks before it serves: a token when bound off loopback,
the bearer token in constant time, and a request body capped before and while it is read.

One copy for krablet's funnel and RPC services, the reward server, the annotation page and
the expander server, so a fix lands in all of them. No web framework is imported: a request
is anything with ``headers.get`` and an async ``stream()`` (Starlette's and FastAPI's are).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import AsyncIterator
from typing import Protocol

from krea2.infra.errors import UserError

__all__ = [
    "BodyTooLarge",
    "TokenRequired",
    "check_bind",
    "is_loopback",
    "read_body",
    "token_matches",
]


class TokenRequired(UserError, ValueError):
    """A server asked to bind off loopback without a token. A ValueError for the libraries'
    callers, a UserError for the CLI host (one line, exit 2)."""


class BodyTooLarge(Exception):
    """A request body over the server's cap (answer 413 and close the connection)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes (the server's cap)")
        self.limit = limit


class _Headers(Protocol):
    def get(self, key: str, default: None = None) -> str | None: ...


class StreamingRequest(Protocol):
    """The part of a Starlette/FastAPI ``Request`` that :func:`read_body` uses."""

    @property
    def headers(self) -> _Headers: ...

    def stream(self) -> AsyncIterator[bytes]: ...


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def check_bind(host: str, token: str | None, what: str, token_env: str) -> None:
    """Refuse to expose ``what`` beyond this machine without a token: raises
    :class:`TokenRequired` naming the flag, the variable and the loopback alternative."""
    if not is_loopback(host) and not token:
        raise TokenRequired(
            f"binding {host} exposes {what} beyond this machine; give a token "
            f"(--token or {token_env}) or bind 127.0.0.1"
        )


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant time)."""
    given = (authorization or "").encode()
    return hmac.compare_digest(given, f"Bearer {token}".encode())


async def read_body(request: StreamingRequest, max_bytes: int) -> bytes:
    """The request body, refused (:class:`BodyTooLarge`) before a byte of it is read when
    its Content-Length is over ``max_bytes``, and as soon as the bytes read pass it when it
    is chunked or lies: the server never holds more than ``max_bytes`` of one body."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.strip().isdigit() or int(declared) > max_bytes):
        raise BodyTooLarge(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)
