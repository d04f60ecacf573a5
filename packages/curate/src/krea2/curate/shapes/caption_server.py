"""ShapesWorld's deterministic captioner behind an OpenAI-compatible HTTP server.

Stands in for the VLM and the rewriting LLM of ``krea2.curate.captioning`` where no model
can be downloaded: a real local HTTP server answering ``POST /v1/chat/completions``, so the
captions job talks to it exactly as to vLLM. A request with an image is a VLM request: the
verifier's detection (``detect_objects``) describes each object's colour, shape and cell,
and the OCR text given in the prompt is quoted. A request without one is a rewrite: the
description is cut into the five caption formats, as JSON.

Faults on purpose, for tests and the caption check: ``omit_colors`` (colours the "VLM"
never names: a consistent omission), ``fail_first`` (that many HTTP 503s first: an
overloaded server), ``garbage`` (answers that are not what was asked).

Hostile input gets a 4xx, never a traceback: a body over ``MAX_BODY_BYTES`` is refused (413)
before it is read, images go through curate's safe decode (PNG/JPEG/WebP/GIF/BMP/TIFF
only, the pixel count checked from the header: 413 past ``MAX_PIXELS``), malformed JSON or
messages get 400, an undecodable image 422; off loopback a bearer token is required.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from krea2.curate.config import DecodeLimits
from krea2.curate.decode import DecodeError, decode
from krea2.curate.shapes.detect import detect_objects
from krea2.curate.shapes.spec import CELLS, SHAPES
from krea2.infra.serving import check_bind, token_matches

MAX_BODY_BYTES = 32 * 2**20  # a request (base64 images and all)
MAX_PIXELS = 16_000_000  # per image, from its header, before any pixel is decoded
TOKEN_ENV = "KREA2_CAPTION_TOKEN"


class BadImage(ValueError):
    """An image the server will not decode; ``status`` is the HTTP answer (413 or 422)."""

    def __init__(self, error: DecodeError) -> None:
        super().__init__(f"image refused: {error}")
        self.status = 413 if error.reason in ("too_many_pixels", "file_too_large") else 422


@dataclass
class Faults:
    omit_colors: frozenset[str] = frozenset()
    fail_first: int = 0
    garbage: bool = False
    served: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def describe(pixels: np.ndarray, ocr: str, omit_colors: frozenset[str]) -> str:
    """The toy VLM's caption of (h, w, 3) uint8 ``pixels`` given the OCR text."""
    parts = []
    for o in detect_objects(pixels):
        color = "" if o.color in omit_colors else f"{o.color} "
        article = "an" if (color or o.shape)[0] in "aeiou" else "a"
        parts.append(f"{article} {color}{o.shape} in the {CELLS[o.cell]}")
    text = ("The image shows " + ", and ".join(parts) + ".") if parts else "An empty scene."
    if ocr.strip():
        text += f' The text "{ocr.strip()}" is written in it.'
    return text


_NOUN = re.compile(rf"\b(?:a|an) ((?:\w+ )?(?:{'|'.join(map(re.escape, SHAPES))}))\b")


def rewrite(description: str) -> str:
    """The toy LLM's rewrite of a description into the caption formats, as JSON text."""
    nouns = _NOUN.findall(description)
    quoted = re.findall(r'"([^"]+)"', description)
    short = " and ".join(nouns) or "a scene"
    return json.dumps(
        {
            "long": description,
            "medium": re.split(r"(?<=\.)\s", description)[0],
            "short": short,
            "tags": ", ".join(nouns),
            "json": {"objects": nouns, "text": quoted[0] if quoted else ""},
        }
    )


def answer(body: dict[str, Any], faults: Faults) -> str:
    """The text a chat request gets."""
    user = [m for m in body["messages"] if m.get("role") == "user"][-1]["content"]
    parts = user if isinstance(user, list) else [{"type": "text", "text": user}]
    text = " ".join(p.get("text", "") for p in parts if p.get("type") == "text")
    images = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
    if faults.garbage:
        return "?!" if images else "certainly! here is some json: {oops"
    if images and "were grouped together" in text:  # name a group (naming.NAME_PROMPT)
        return name_group([_pixels(u) for u in images])
    if images:
        pixels = _pixels(images[0])
        m = re.search(r"Text found by OCR: (\".*?\")\n", text)
        return describe(pixels, json.loads(m.group(1)) if m else "", faults.omit_colors)
    m = re.search(r"Description: (.*)\Z", text, re.S)
    return rewrite(m.group(1).strip() if m else text)


def _pixels(url: str) -> np.ndarray:
    """(h, w, 3) uint8 pixels of a ``data:`` URL, by curate's safe decode (longest side kept
    up to 4096 px); :class:`BadImage` for anything it refuses."""
    data = base64.b64decode(url.split(",", 1)[1], validate=True)
    limits = DecodeLimits(max_bytes=MAX_BODY_BYTES, max_pixels=MAX_PIXELS, analysis_size=4096)
    try:
        return np.asarray(decode(data, limits).pixels)
    except DecodeError as exc:
        raise BadImage(exc) from None


def name_group(images: list[np.ndarray]) -> str:
    """The toy VLM's name of a group: its most common colour+shape, flagged "mixed" when
    that is in fewer than half of the images."""
    per_image = [{f"{o.color} {o.shape}" for o in detect_objects(p)} for p in images]
    counts: dict[str, int] = {}
    for found in per_image:
        for phrase in sorted(found):
            counts[phrase] = counts.get(phrase, 0) + 1
    if not counts:
        return json.dumps({"name": "empty scenes", "flag": ""})
    name = max(sorted(counts), key=lambda k: counts[k])
    flag = "mixed content" if 2 * counts[name] < len(images) else ""
    return json.dumps({"name": name, "flag": flag})


def _handler(faults: Faults, token: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if token and not token_matches(self.headers.get("Authorization"), token):
                return self._send(401, {"error": "a bearer token is required"}, close=True)
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._send(404, {"error": f"no route {self.path}"}, close=True)
            declared = (self.headers.get("Content-Length") or "").strip()
            if not declared.isdigit():
                return self._send(411, {"error": "a Content-Length is required"}, close=True)
            if int(declared) > MAX_BODY_BYTES:
                return self._send(413, {"error": f"body over {MAX_BODY_BYTES} bytes"}, close=True)
            with faults.lock:
                faults.served += 1
                busy = faults.served <= faults.fail_first
            if busy:
                return self._send(503, {"error": "overloaded"}, close=True)
            try:
                body = json.loads(self.rfile.read(int(declared)))
                content = answer(body, faults)
            except BadImage as exc:
                return self._send(exc.status, {"error": str(exc)})
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                return self._send(400, {"error": f"bad request: {type(exc).__name__}: {exc}"})
            except RecursionError:
                return self._send(400, {"error": "bad request: JSON nested too deeply"})
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}]})

        def _send(self, status: int, payload: dict, close: bool = False) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            if close:  # the body was not read: the connection cannot carry another request
                self.send_header("Connection", "close")
                self.close_connection = True
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    return Handler


def start_caption_server(
    host: str = "127.0.0.1", port: int = 0, token: str | None = None, **faults: Any
) -> tuple[ThreadingHTTPServer, str]:
    """Serve in a daemon thread; returns (the server, its base URL). ``token``: the bearer
    token every request must carry (required off loopback: ``TokenRequired``). ``faults``:
    the ``Faults`` fields. Stop it with ``server.shutdown()``."""
    check_bind(host, token, "the caption server", TOKEN_ENV)
    server = ThreadingHTTPServer((host, port), _handler(Faults(**faults), token))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"
