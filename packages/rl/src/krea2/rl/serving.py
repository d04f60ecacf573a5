"""What the HTTP servers of krea2.rl and krea2.expander check before they serve: JSON
small and shallow enough to parse without a 500, and image files of an allowed type; with
the token and body-cap guards every krea2 server shares (``krea2.infra.serving``, re-exported
here for the expander, which imports them from ``krea2.rl``).
"""

from __future__ import annotations

import json
from typing import Any

from krea2.infra.serving import (
    BodyTooLarge,
    TokenRequired,
    check_bind,
    is_loopback,
    read_body,
    token_matches,
)

__all__ = [
    "IMAGE_TYPES",
    "BadJson",
    "BodyTooLarge",
    "TokenRequired",
    "check_bind",
    "image_type",
    "is_loopback",
    "json_depth_over",
    "load_json",
    "read_body",
    "token_matches",
]

# A JSON value holds at most one value more than it has commas (commas inside strings only
# overcount), so counting them bounds what ``json.loads`` builds before it runs: 10,000
# one-character strings cost ~0.6 MB of Python objects however the body packs them.
MAX_JSON_VALUES = 100_000
MAX_JSON_DEPTH = 32  # our requests nest 3 deep; json.loads on 100,000 "[" raises RecursionError


# The image files a server opens or serves, by Pillow's format name: Pillow knows ~40
# formats, some of which hand the file to other programs (EPS to Ghostscript).
IMAGE_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}


class BadJson(ValueError):
    """A body that is not JSON, or JSON too large or too deeply nested to accept (400)."""


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
