"""Animation filter: an animated GIF/WebP is not a still; only its first frame was decoded."""

from __future__ import annotations

from krea2.curate.config import StageThresholds
from krea2.curate.decode import DecodedImage
from krea2.curate.filters.base import FilterResult


def animation(image: DecodedImage, t: StageThresholds) -> FilterResult:
    """Score: 1.0 for an animated file, else 0.0."""
    score = 1.0 if image.animated else 0.0
    if image.animated and t.reject_animated:
        return FilterResult("animation", score, False, "animated image (first frame only)")
    return FilterResult("animation", score, True)
