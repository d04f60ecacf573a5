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
JSON), 401 (token), 422 (bad images or prompts), 503 (shutting down), 504 (timed out),
each with ``{"detail": "<what is wrong and how to fix it>"}``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from krea2.rl.rewards.contract import RewardOutput


class BadRequest(ValueError):
    """A request the server rejects with 422; the message says what to fix."""


def encode_images(pixels: np.ndarray) -> dict[str, Any]:
    """uint8 ``[B, H, W, 3]`` → the ``images`` field."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    return {"shape": list(pixels.shape), "data": base64.b64encode(pixels.tobytes()).decode()}


def _check_shape(shape: Any, name: str) -> list[int]:
    if (
        not isinstance(shape, list)
        or len(shape) != 4
        or not all(isinstance(s, int) and s >= 0 for s in shape)
        or shape[3] != 3
    ):
        raise BadRequest(f'"{name}" must be [B, H, W, 3] of non-negative ints, got {shape}')
    return shape


def _pixels(raw: bytes | memoryview, shape: list[int], name: str) -> np.ndarray:
    expected = int(np.prod(shape))
    if len(raw) != expected:
        raise BadRequest(
            f"{name} has {len(raw)} bytes but shape {shape} needs {expected} (uint8 RGB, row-major)"
        )
    return np.frombuffer(raw, np.uint8).reshape(shape)


def _decode_raw(field: Any) -> np.ndarray:
    if not isinstance(field, dict) or "shape" not in field or "data" not in field:
        raise BadRequest('"images" must be {"shape": [B, H, W, 3], "data": "<base64>"}')
    shape = _check_shape(field["shape"], "images.shape")
    try:
        raw = base64.b64decode(field["data"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise BadRequest('"images.data" is not valid base64') from None
    return _pixels(raw, shape, '"images.data"')


def _decode_png(field: Any) -> np.ndarray:
    if not isinstance(field, list):
        raise BadRequest('"png" must be a list of base64-encoded image files')
    images = []
    for i, item in enumerate(field):
        try:
            with Image.open(io.BytesIO(base64.b64decode(item, validate=True))) as img:
                images.append(np.asarray(img.convert("RGB")))
        except (binascii.Error, TypeError, ValueError, OSError, UnidentifiedImageError):
            raise BadRequest(f"image {i} cannot be decoded (not a base64 PNG/JPEG file)") from None
    if len({im.shape for im in images}) > 1:
        sizes = sorted({im.shape[:2] for im in images})
        raise BadRequest(f"images of one request must share a size, got (H, W) {sizes}")
    return np.stack(images) if images else np.zeros((0, 1, 1, 3), np.uint8)


def _id_and_prompts(body: dict[str, Any]) -> tuple[str | None, list[str]]:
    request_id = body.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest('"request_id" must be a string')
    if "prompts" not in body:
        raise BadRequest('missing "prompts": one prompt per image')
    prompts = body["prompts"]
    if not isinstance(prompts, list):
        raise BadRequest('"prompts" must be a list of strings')
    return request_id, prompts


def decode_request(body: Any) -> tuple[str | None, np.ndarray, list[str]]:
    """``(request_id, uint8 [B, H, W, 3], prompts)`` of a request body; raises
    :class:`BadRequest` naming the bad field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with prompts and images")
    request_id, prompts = _id_and_prompts(body)
    if ("images" in body) == ("png" in body):
        raise BadRequest('send exactly one of "images" (raw uint8) or "png" (encoded files)')
    pixels = _decode_raw(body["images"]) if "images" in body else _decode_png(body["png"])
    return request_id, pixels, prompts


BINARY_TYPE = "application/x-krea2-images"


def encode_binary(pixels: np.ndarray, prompts: list[str], request_id: str | None) -> bytes:
    """uint8 ``[B, H, W, 3]`` and their prompts → a binary request body (``BINARY_TYPE``)."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    head = {"request_id": request_id, "prompts": prompts, "shape": list(pixels.shape)}
    header = json.dumps(head).encode()
    return len(header).to_bytes(4, "big") + header + pixels.tobytes()


def decode_binary(body: bytes) -> tuple[str | None, np.ndarray, list[str]]:
    """``(request_id, uint8 [B, H, W, 3], prompts)`` of a binary request body; raises
    :class:`BadRequest` naming what is wrong. The pixels are a view of ``body``."""
    if len(body) < 4:
        raise BadRequest(f"a binary body of {len(body)} bytes is too short for its 4-byte length")
    size = int.from_bytes(body[:4], "big")
    if len(body) < 4 + size:
        raise BadRequest(
            f"a binary body of {len(body)} bytes is too short for its {size}-byte JSON header "
            "(see krea2.rl.rewards.wire)"
        )
    try:
        head = json.loads(body[4 : 4 + size])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("the binary body's header is not UTF-8 JSON") from None
    if not isinstance(head, dict) or "shape" not in head:
        raise BadRequest('the binary header must be {"request_id", "prompts", "shape"}')
    request_id, prompts = _id_and_prompts(head)
    shape = _check_shape(head["shape"], "shape")
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
