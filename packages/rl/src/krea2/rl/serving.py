"""What every HTTP server of krea2.rl and krea2.expander checks before it serves: a token
when bound off loopback, the bearer token in constant time, a body capped before and while
it is read, and JSON small and shallow enough to parse without a 500.

One copy for the reward server, the annotation page and the expander server (which imports
it from ``krea2.rl``), so a fix lands in all three.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from typing import TYPE_CHECKING, Any

from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from fastapi import Request

# A JSON value holds at most one value more than it has commas (commas inside strings only
# overcount), so counting them bounds what ``json.loads`` builds before it runs: 10,000
# one-character strings cost ~0.6 MB of Python objects however the body packs them.
MAX_JSON_VALUES = 100_000
MAX_JSON_DEPTH = 32  # our requests nest 3 deep; json.loads on 100,000 "[" raises RecursionError


# The image files a server opens or serves, by Pillow's format name: Pillow knows ~40
# formats, some of which hand the file to other programs (EPS to Ghostscript).
IMAGE_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}


class TokenRequired(UserError, ValueError):
    """A server asked to bind off loopback without a token. A ValueError for the library's
    callers (as before), a UserError for the CLI host (one line, exit 2)."""


class BodyTooLarge(Exception):
    """A request body over the server's cap (answer 413 and close the connection)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes (the server's cap)")
        self.limit = limit


class BadJson(ValueError):
    """A body that is not JSON, or JSON too large or too deeply nested to accept (400)."""


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


async def read_body(request: Request, max_bytes: int) -> bytes:
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


def json_depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests deeper than ``limit`` containers (iterative:
    the check itself never recurses)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def load_json(
    raw: bytes, max_values: int = MAX_JSON_VALUES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """``raw`` parsed as JSON; :class:`BadJson` saying why when it is not JSON, holds more
    than ``max_values`` values or nests deeper than ``max_depth``."""
    if raw.count(b",") + 1 > max_values:
        raise BadJson(f"the JSON body holds more than {max_values} values")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadJson(f"the JSON body nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, a 5000-digit int
        raise BadJson(f"the body is not JSON ({type(e).__name__}: {e})"[:300]) from None
    if json_depth_over(value, max_depth):
        raise BadJson(f"the JSON body nests deeper than {max_depth} levels")
    return value


def image_type(data: bytes) -> str | None:
    """The media type of ``data`` when its header is a PNG, JPEG or WebP file's (nothing is
    decoded), else None."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=tuple(IMAGE_TYPES)) as img:
            return IMAGE_TYPES.get(img.format or "")
    except Exception:  # any header Pillow cannot parse is "not an image"
        return None
