"""What `POST /v1/images/generations` accepts: the OpenAI Images fields (``prompt``, ``n``,
``size``, ``response_format``, ``seed``; ``model`` and ``user`` are read and checked or
ignored) and krea2's own (``steps``, ``cfg``, ``negative_prompt``, ``turbo``,
``style_references``, ``style_times``, ``loras``), checked against the server's
:class:`RequestLimits`.

A request is parsed from its raw bytes into an :class:`ImageJob`: JSON types as sent (no
"1" for 1), no unknown field, every range checked, style references decoded (base64 PNG,
JPEG or WebP, their pixels capped before they are decoded). Each mistake is a
:class:`BadRequest` naming the field, the bad value and what is allowed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from krea2.dit.served_model import Shape

if TYPE_CHECKING:
    from PIL import Image

    from krea2.dit.served_model import ServedModel

__all__ = ["BadRequest", "ImageJob", "ImageRequest", "RequestLimits", "parse_request"]

# A JSON value holds at most one value more than it has commas, so counting them bounds
# what the parser builds before it runs (as krea2.rl.serving.load_json does).
MAX_JSON_VALUES = 100_000
REFERENCE_TYPES = ("PNG", "JPEG", "WEBP")  # what Pillow may open a reference as
_SIZE = re.compile(r"^(\d{1,6})x(\d{1,6})$")
_DATA_URL = re.compile(r"^data:image/[\w.+-]+;base64,")
MAX_LORA_SCALE = 8.0  # beyond this an adapter only adds noise; a typo, not a choice


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for: ``max_n`` images, ``max_steps`` Euler steps, sides up
    to ``max_side`` pixels, a body of ``max_body_bytes`` (413 beyond, refused before it is
    read; style references travel in it as base64), prompts of ``max_prompt_chars``, and
    reference images of ``max_reference_pixels`` (checked from the file's header)."""

    max_n: int = 8
    max_steps: int = 100
    max_side: int = 2048
    max_body_bytes: int = 16 * 2**20
    max_prompt_chars: int = 16_000
    max_reference_pixels: int = 4096 * 4096


class BadRequest(ValueError):
    """A request the server refuses: ``status`` (4xx), the message, the field (``param``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


class StyleReference(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    image: str  # base64 PNG, JPEG or WebP, optionally as a data: URL
    strength: float = Field(default=1.0, ge=0, allow_inf_nan=False)


class LoraChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str  # one the server loaded (--lora NAME=PATH)
    scale: float = Field(default=1.0, ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE, allow_inf_nan=False)


class ImageRequest(BaseModel):
    """The body of ``POST /v1/images/generations``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    prompt: str
    n: int = 1
    size: str | None = None  # "WIDTHxHEIGHT"; None: the server's default size
    response_format: Literal["b64_json", "url"] = "b64_json"
    seed: int | None = Field(default=None, ge=0, lt=2**32)  # image i uses seed + i
    model: str | None = None  # None or the served model's name
    user: str | None = None  # accepted for OpenAI clients, not used
    steps: int | None = None  # None: the model's own (Turbo's 8 for a distilled one)
    cfg: float | None = Field(default=None, ge=0, le=100, allow_inf_nan=False)
    negative_prompt: str = ""
    turbo: bool = False
    style_references: list[StyleReference] = []
    # [lo, hi]: the references act only at flow times lo <= t <= hi (1 = noise); None: always
    style_times: tuple[float, float] | None = None
    loras: list[LoraChoice] = []  # [{name, scale}] of the adapters the server loaded


@dataclass(frozen=True)
class ImageJob:
    """A parsed request: ``n`` images of ``prompt`` at ``shape``, image i with seed
    ``seed + i``, and the style references (image, strength) they share."""

    prompt: str
    n: int
    shape: Shape
    seed: int
    response_format: str = "b64_json"
    refs: tuple[tuple[Image.Image, float], ...] = ()

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.n)]


def parse_request(
    raw: bytes, model: ServedModel, limits: RequestLimits, default_size: str
) -> ImageJob:
    """The :class:`ImageJob` of the JSON body ``raw`` for ``model``; :class:`BadRequest`
    naming the first problem (blocking: base64 and image decoding take milliseconds)."""
    if raw.count(b",") + 1 > MAX_JSON_VALUES:
        raise BadRequest(f"the JSON body holds more than {MAX_JSON_VALUES} values")
    try:
        body = ImageRequest.model_validate_json(raw)
    except ValidationError as e:
        raise _bad_field(e) from None
    if body.model not in (None, model.name):
        raise BadRequest(
            f"model {body.model!r} is not served here; use {model.name!r}", "model", 404
        )
    if not body.prompt.strip():
        raise BadRequest("prompt: must not be empty", "prompt")
    for name, text in (("prompt", body.prompt), ("negative_prompt", body.negative_prompt)):
        if len(text) > limits.max_prompt_chars:
            raise BadRequest(
                f"{name}: {len(text)} characters; this server takes at most "
                f"{limits.max_prompt_chars}",
                name,
            )
    if not 1 <= body.n <= limits.max_n:
        raise BadRequest(
            f"n: {body.n} is out of range; this server makes 1 to "
            f"{limits.max_n} images per request",
            "n",
        )
    width, height = _size(body.size or default_size, model.size_multiple, limits.max_side)
    steps, cfg = model.defaults(body.turbo)
    steps = body.steps if body.steps is not None else steps
    cfg = body.cfg if body.cfg is not None else cfg
    if not 1 <= steps <= limits.max_steps:
        given = "" if body.steps is not None else " (the model's default; send steps)"
        raise BadRequest(
            f"steps: {steps}{given} is out of range; this server takes 1 to {limits.max_steps}",
            "steps",
        )
    refs, style = _references(body.style_references, model.style_slots, limits)
    times = _style_times(body.style_times, bool(refs))
    loras = _loras(body.loras, sorted(model.loras))
    negative = body.negative_prompt if cfg else ""
    shape = Shape(width, height, steps, cfg, body.turbo, negative, style, loras, style_times=times)
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    return ImageJob(body.prompt, body.n, shape, seed, body.response_format, refs)


def _bad_field(error: ValidationError) -> BadRequest:
    """The first problem pydantic found, as a BadRequest naming its field."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    if first["type"] == "json_invalid":
        return BadRequest(f"the body is not JSON: {first['msg']}")
    if first["type"] == "extra_forbidden":
        fields = ", ".join(ImageRequest.model_fields)
        return BadRequest(
            f"{where}: unknown field; the fields are {fields} (style references: image, "
            "strength; loras: name, scale)",
            where,
        )
    if first["type"] == "model_type" and not where:
        return BadRequest('the body must be a JSON object like {"prompt": "a red circle"}')
    return BadRequest(f"{where or 'body'}: {first['msg']}", where or None)


def _size(size: str, multiple: int, max_side: int) -> tuple[int, int]:
    m = _SIZE.match(size.strip().lower())
    if m is None:
        raise BadRequest(f"size: {size!r} must look like WIDTHxHEIGHT, e.g. 1024x1024", "size")
    width, height = int(m[1]), int(m[2])
    if width < 1 or height < 1:
        raise BadRequest(f"size: {size!r} must be positive", "size")
    if max(width, height) > max_side:
        raise BadRequest(
            f"size: {size} is over this server's largest side, {max_side} pixels", "size"
        )
    if width % multiple or height % multiple:
        near = f"{max(multiple, width // multiple * multiple)}x"
        near += f"{max(multiple, height // multiple * multiple)}"
        raise BadRequest(
            f"size: {size}: width and height must be multiples of {multiple} "
            f"(autoencoder factor x patch), e.g. {near}",
            "size",
        )
    return width, height


def _style_times(given: tuple[float, float] | None, has_refs: bool) -> tuple[float, float] | None:
    """The checked (lo, hi) window of the references, or None (always)."""
    if given is None:
        return None
    if not has_refs:
        raise BadRequest("style_times: it times the style references; send "
                         "style_references with it, or leave it out", "style_times")  # fmt: skip
    from krea2.dit.sampler import check_style_times
    from krea2.infra.errors import UserError

    try:
        return check_style_times(given)
    except UserError as e:
        raise BadRequest(f"style_times: {e}", "style_times") from None


def _loras(given: list[LoraChoice], loaded: list[str]) -> tuple[tuple[str, float], ...]:
    """(name, scale) per requested adapter, each loaded and named once; scale 0 dropped (it
    adds nothing, and requests that differ only by it then batch together)."""
    seen: set[str] = set()
    for i, choice in enumerate(given):
        if choice.name not in loaded:
            have = ", ".join(loaded) if loaded else "none (start it with --lora NAME=PATH)"
            raise BadRequest(
                f"loras.{i}.name: {choice.name!r} is not loaded here; loaded: {have}",
                f"loras.{i}.name",
            )
        if choice.name in seen:
            raise BadRequest(f"loras.{i}.name: {choice.name!r} is named twice; give it once "
                             "with the sum of the scales", f"loras.{i}.name")  # fmt: skip
        seen.add(choice.name)
    return tuple((c.name, c.scale) for c in given if c.scale != 0)


def _references(
    given: list[StyleReference], slots: int, limits: RequestLimits
) -> tuple[tuple[tuple[Image.Image, float], ...], str]:
    """(image, strength) per reference and a digest of them all ("" for none)."""
    if not given:
        return (), ""
    if slots == 0:
        raise BadRequest(
            "style_references: this model has no style module (a "
            "style.safetensors in its folder); send none",
            "style_references",
        )
    if len(given) > slots:
        raise BadRequest(
            f"style_references: {len(given)} given; this model's style module "
            f"takes at most {slots}",
            "style_references",
        )
    digest = hashlib.sha256()
    refs = []
    for i, ref in enumerate(given):
        where = f"style_references.{i}.image"
        data = _base64(ref.image, where)
        refs.append((_open_image(data, where, limits.max_reference_pixels), ref.strength))
        digest.update(hashlib.sha256(data).digest() + repr(ref.strength).encode())
    return tuple(refs), digest.hexdigest()


def _base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(_DATA_URL.sub("", text.strip(), count=1), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}: not base64 (send the file's bytes base64-encoded)",
                         where) from None  # fmt: skip


def _open_image(data: bytes, where: str, max_pixels: int) -> Image.Image:
    """The decoded RGB image of a PNG, JPEG or WebP file, its size checked from its header."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=REFERENCE_TYPES) as img:
            if img.width * img.height > max_pixels:
                raise BadRequest(
                    f"{where}: {img.width}x{img.height} is over this server's "
                    f"{max_pixels} pixels per reference",
                    where,
                )
            img.load()  # a truncated file fails here, not mid-batch
            return img.convert("RGB")
    except BadRequest:
        raise
    except Exception as e:  # any file Pillow cannot decode is "not an image"
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise BadRequest(f"{where}: cannot decode the image ({why}); send a PNG, JPEG or "
                         "WebP", where) from None  # fmt: skip
