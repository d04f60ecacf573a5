"""Per-image analysis: the one decode, then every cheap filter and hash, as one flat record."""

from __future__ import annotations

import io
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np
from PIL import Image

from krea2.curate.config import CurateConfig
from krea2.curate.decode import DecodedImage, DecodeError, DecodeLimits, decode
from krea2.curate.filters import CHEAP_FILTERS, FilterResult, run_cheap_filters
from krea2.curate.hashes import image_hashes, md5
from krea2.curate.planes import planes


def decode_limits(cfg: CurateConfig, analysis_size: int | None = None) -> DecodeLimits:
    return replace(cfg.decode, analysis_size=analysis_size or cfg.decode.analysis_size)


@dataclass
class ImageAnalysis:
    """What the cheap stage knows about one image.

    ``filters``: one result per cheap filter (empty when the decode failed); ``reject``:
    the first failing filter's name (``truncated`` or ``broken`` for a failed decode)
    or ``None``.
    Hashes are raw bytes: phash8 8 B, phash12 18 B, colorhash 6 B, huehist 19 B, crop ladder
    180 B. ``alpha``: how an image
    with alpha was composited (``DecodedImage.alpha``), None without alpha.
    """

    md5: str
    width: int | None = None
    height: int | None = None
    format: str | None = None
    alpha: str | None = None
    filters: list[FilterResult] = field(default_factory=list)
    hashes: dict[str, bytes] = field(default_factory=dict)
    decode_error: str | None = None
    reason: str | None = None

    @property
    def reject(self) -> str | None:
        if self.decode_error is not None:
            return "truncated" if self.decode_error == "truncated" else "broken"
        return next((f.name for f in self.filters if not f.passed), None)

    def columns(self) -> dict:
        """Flat warehouse columns: ``score_<filter>`` per filter plus the verdict."""
        row: dict = {
            "md5": self.md5,
            "width": self.width,
            "height": self.height,
            "format": self.format,
            "alpha": self.alpha,
            "decode_error": self.decode_error,
            "reject": self.reject,
            "reason": self.reason,
            "phash8": self.hashes.get("phash8"),
            "phash12": self.hashes.get("phash12"),
            "colorhash": self.hashes.get("colorhash"),
            "huehist": self.hashes.get("huehist"),
            "ladder": self.hashes.get("ladder"),
        }
        for name in CHEAP_FILTERS:
            row[f"score_{name}"] = None
        for f in self.filters:
            row[f"score_{f.name}"] = f.score
        return row


def analyze_bytes(data: bytes, cfg: CurateConfig | None = None) -> ImageAnalysis:
    """Decode once at reduced scale, then run the stage's cheap filters and all hashes.

    Never raises for bad bytes: a failed decode is recorded with its reason.
    """
    cfg = cfg or CurateConfig()
    try:
        image = decode(data, decode_limits(cfg))
    except DecodeError as e:
        return ImageAnalysis(md5=md5(data), decode_error=e.reason, reason=str(e))
    return analyze_decoded(data, image, cfg)


def analyze_decoded(data: bytes, image: DecodedImage, cfg: CurateConfig) -> ImageAnalysis:
    """Everything after the decode of ``data``: md5, the cheap filters, the hashes."""
    out = ImageAnalysis(md5=md5(data), width=image.width, height=image.height)
    out.format, out.alpha = image.format, image.alpha
    shared = planes(image.pixels)  # grey, histograms, colour counts, luma, scores: once
    out.filters = run_cheap_filters(image, cfg.thresholds(), shared)
    out.hashes = image_hashes(image.pixels, shared)
    failed = next((f for f in out.filters if not f.passed), None)
    out.reason = failed.reason if failed else None
    return out


@cache
def warm_up() -> None:
    """Load (or, on a machine's first run, compile: ~10-20 s) the compiled kernels and build
    the colour table, once per process, by analysing a small generated image; worker
    processes call it before they take work, so that no image's time bound pays for it."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    analyze_bytes(buffer.getvalue())
