"""The reward servers' wire format (JSON, or JSON framed with raw pixels), shared by the
server and the client.

Request (POST ``/score``, ``Authorization: Bearer <token>`` when the server has one)::

    {"request_id": "3f2c…",                  # optional; a retry repeats it
     "prompts": ["a red circle", …],         # B non-empty strings
     "images": {"shape": [B, H, W, 3],       # raw uint8 RGB, row-major,
                "data": "<base64>"}}         #   base64 of the B·H·W·3 bytes
  or "png": ["<base64 PNG>", …]              # instead of "images": B PNG/JPEG files, same size

or the same request framed in binary (``Content-Type: application/x-krea2-images``; what
:class:`~krea2.rl.rewards.client.RewardClient` sends): a 4-byte big-endian length N, N
bytes of UTF-8 JSON ``{"request_id", "prompts", "shape": [B, H, W, 3]}``, then the B·H·W·3
raw uint8 RGB bytes, row-major. It skips base64 and a JSON string as long as the images
(what that saves: the RL section of docs/benchmarks.md).

Response 200: ``{"request_id", "reward", "scores": [B], "sub_scores": {name: [B]}}`` with
NaN sent as ``null``. Floats are float32 values written as JSON doubles, so they round-trip
exactly: the client returns the same scores as the reward in-process. Errors: 400 (not
JSON, or JSON too large or deep), 401 (token), 413 (over a :class:`RequestLimits` cap), 422
(bad images or prompts), 503 (shutting down), 504 (timed out), each with
``{"detail": "<what is wrong and how to fix it>"}``.

Every size is checked before the bytes it guards are decoded: shapes before pixels are
viewed, an image file's format and declared size (its header, which Pillow reads lazily)
before it is decoded; only PNG, JPEG and WebP files are opened at all (Pillow knows ~40
formats, some of which hand the file to other programs, e.g. EPS to Ghostscript).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from krea2.rl.rewards.contract import RewardOutput
from krea2.rl.serving import IMAGE_TYPES, load_json

IMAGE_FORMATS = tuple(IMAGE_TYPES)  # Pillow's names: the only files a server decodes
MAX_REQUEST_ID_CHARS = 256


@dataclass(frozen=True)
class RequestLimits:
    """What one ``/score`` request may hold (beyond any: 413). ``max_body_bytes`` caps the
    body (64 MiB: 64 images of 512x512 in binary); ``max_images`` the batch; pixels per image
    (``max_image_pixels``, 4096x4096) and per request (``max_request_pixels``, 32 Mi: 96 MiB
    of decoded RGB), counted from shapes and file headers before anything is decoded."""

    max_body_bytes: int = 64 * 2**20
    max_images: int = 256
    max_image_pixels: int = 4096 * 4096
    max_request_pixels: int = 32 * 2**20


class BadRequest(ValueError):
    """A request the server rejects with 422; the message says what to fix."""


class TooLarge(BadRequest):
    """A request over one of the server's :class:`RequestLimits` (413)."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def encode_images(pixels: np.ndarray) -> dict[str, Any]:
    """uint8 ``[B, H, W, 3]`` → the ``images`` field."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    return {"shape": list(pixels.shape), "data": base64.b64encode(pixels.tobytes()).decode()}


def _check_count(count: int, limits: RequestLimits) -> None:
    if count > limits.max_images:
        raise TooLarge(
            f"{count} images in one request; this server takes at most "
            f"{limits.max_images} (send several requests)"
        )


def check_budget(sizes: list[tuple[int, int]], limits: RequestLimits) -> None:
    """Raise :class:`TooLarge` when images of ``sizes`` ``(H, W)`` are too many or too big
    for one request."""
    _check_count(len(sizes), limits)
    total = 0
    for i, (h, w) in enumerate(sizes):
        if h * w > limits.max_image_pixels:
            raise TooLarge(
                f"image {i} is {w}x{h} = {h * w} pixels; this server takes at most "
                f"{limits.max_image_pixels} per image"
            )
        total += h * w
    if total > limits.max_request_pixels:
        raise TooLarge(
            f"{len(sizes)} images of {total} pixels in all; this server takes at most "
            f"{limits.max_request_pixels} per request (send several requests)"
        )


def _check_shape(shape: Any, name: str, limits: RequestLimits) -> list[int]:
    # type(s) is int: JSON true/false parse as bools, which are ints to isinstance
    if (
        not isinstance(shape, list)
        or len(shape) != 4
        or not all(type(s) is int for s in shape)
        or shape[0] < 0
        or min(shape[1:3]) < 1
        or shape[3] != 3
    ):
        raise BadRequest(
            f'"{name}" must be [B, H, W, 3] of integers (B >= 0, H and W >= 1), got {_short(shape)}'
        )
    _check_count(shape[0], limits)  # before a list of B sizes is built
    check_budget([(shape[1], shape[2])] * shape[0], limits)
    return shape


def _pixels(raw: bytes | memoryview, shape: list[int], name: str) -> np.ndarray:
    expected = math.prod(shape)  # exact: no int64 overflow on a lying shape
    if len(raw) != expected:
        raise BadRequest(
            f"{name} has {len(raw)} bytes but shape {shape} needs {expected} (uint8 RGB, row-major)"
        )
    return np.frombuffer(raw, np.uint8).reshape(shape)


def _decode_raw(field: Any, limits: RequestLimits) -> np.ndarray:
    if not isinstance(field, dict) or "shape" not in field or "data" not in field:
        raise BadRequest('"images" must be {"shape": [B, H, W, 3], "data": "<base64>"}')
    shape = _check_shape(field["shape"], "images.shape", limits)
    try:
        raw = base64.b64decode(field["data"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise BadRequest('"images.data" is not valid base64') from None
    return _pixels(raw, shape, '"images.data"')


def _open_header(data: bytes, i: int, limits: RequestLimits) -> Image.Image:
    """The image file ``data`` opened lazily (its header read, no pixel decoded)."""
    try:
        return Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError:  # Pillow's own cap (~179 Mpx), above ours
        raise TooLarge(
            f"image {i} declares over {limits.max_image_pixels} pixels, this server's cap"
        ) from None
    except Exception:  # any failure to parse a client's header is that client's bad file
        raise BadRequest(
            f"image {i} cannot be decoded: not a PNG, JPEG or WebP file (base64 of the file)"
        ) from None


def _decode_files(field: Any, limits: RequestLimits) -> np.ndarray:
    if not isinstance(field, list):
        raise BadRequest('"png" must be a list of base64-encoded image files')
    _check_count(len(field), limits)  # before any file is read
    opened = []
    for i, item in enumerate(field):
        try:
            data = base64.b64decode(item, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise BadRequest(f"image {i} cannot be decoded (not base64 of a file)") from None
        opened.append(_open_header(data, i, limits))
    check_budget([(img.height, img.width) for img in opened], limits)  # before any decode
    if len({img.size for img in opened}) > 1:
        sizes = sorted({(img.height, img.width) for img in opened})
        raise BadRequest(f"images of one request must share a size, got (H, W) {sizes}")
    images = []
    for i, img in enumerate(opened):
        try:
            with img:
                images.append(np.asarray(img.convert("RGB")))
        except Exception:  # truncated or corrupt data behind a valid header
            raise BadRequest(f"image {i} cannot be decoded (a truncated or corrupt file)") from None
    return np.stack(images) if images else np.zeros((0, 1, 1, 3), np.uint8)


def _id_and_prompts(body: dict[str, Any]) -> tuple[str | None, list[str]]:
    request_id = body.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest('"request_id" must be a string')
    if request_id is not None and len(request_id) > MAX_REQUEST_ID_CHARS:
        raise BadRequest(f'"request_id" is over {MAX_REQUEST_ID_CHARS} characters')
    if "prompts" not in body:
        raise BadRequest('missing "prompts": one prompt per image')
    prompts = body["prompts"]
    if not isinstance(prompts, list):
        raise BadRequest('"prompts" must be a list of strings')
    return request_id, prompts


def decode_request(
    body: Any, limits: RequestLimits | None = None
) -> tuple[str | None, np.ndarray, list[str]]:
    """``(request_id, uint8 [B, H, W, 3], prompts)`` of a request body; raises
    :class:`BadRequest` naming the bad field (:class:`TooLarge` past ``limits``)."""
    limits = limits or RequestLimits()
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with prompts and images")
    request_id, prompts = _id_and_prompts(body)
    if ("images" in body) == ("png" in body):
        raise BadRequest('send exactly one of "images" (raw uint8) or "png" (encoded files)')
    if "images" in body:
        pixels = _decode_raw(body["images"], limits)
    else:
        pixels = _decode_files(body["png"], limits)
    return request_id, pixels, prompts


BINARY_TYPE = "application/x-krea2-images"


def encode_binary(pixels: np.ndarray, prompts: list[str], request_id: str | None) -> bytes:
    """uint8 ``[B, H, W, 3]`` and their prompts → a binary request body (``BINARY_TYPE``)."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    head = {"request_id": request_id, "prompts": prompts, "shape": list(pixels.shape)}
    header = json.dumps(head).encode()
    return len(header).to_bytes(4, "big") + header + pixels.tobytes()


def decode_binary(
    body: bytes, limits: RequestLimits | None = None
) -> tuple[str | None, np.ndarray, list[str]]:
    """``(request_id, uint8 [B, H, W, 3], prompts)`` of a binary request body; raises
    :class:`BadRequest` naming what is wrong. The pixels are a view of ``body``."""
    limits = limits or RequestLimits()
    if len(body) < 4:
        raise BadRequest(f"a binary body of {len(body)} bytes is too short for its 4-byte length")
    size = int.from_bytes(body[:4], "big")
    if len(body) < 4 + size:
        raise BadRequest(
            f"a binary body of {len(body)} bytes is too short for its {size}-byte JSON header "
            "(see krea2.rl.rewards.wire)"
        )
    try:
        head = load_json(body[4 : 4 + size])
    except ValueError as e:
        raise BadRequest(f"the binary body's header is not UTF-8 JSON we accept: {e}") from None
    if not isinstance(head, dict) or "shape" not in head:
        raise BadRequest('the binary header must be {"request_id", "prompts", "shape"}')
    request_id, prompts = _id_and_prompts(head)
    shape = _check_shape(head["shape"], "shape", limits)
    return request_id, _pixels(memoryview(body)[4 + size :], shape, "the pixel data"), prompts


def _nullable(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values]


def encode_output(out: RewardOutput) -> dict[str, Any]:
    return {
        "scores": _nullable(out.scores),
        "sub_scores": {k: _nullable(v) for k, v in out.sub_scores.items()},
    }


def decode_output(body: dict[str, Any]) -> RewardOutput:
    def arr(values: list[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in values], np.float32)

    return RewardOutput(arr(body["scores"]), {k: arr(v) for k, v in body["sub_scores"].items()})
