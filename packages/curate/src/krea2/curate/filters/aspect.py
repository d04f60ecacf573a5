"""Aspect-ratio filter: extreme panoramas and strips cannot be bucketed without losing content."""

from __future__ import annotations

from krea2.curate.config import StageThresholds
from krea2.curate.decode import DecodedImage
from krea2.curate.filters.base import FilterResult, at_most


def aspect_ratio(image: DecodedImage, t: StageThresholds) -> FilterResult:
    """Score: longer side / shorter side (≥ 1)."""
    ratio = max(image.width, image.height) / min(image.width, image.height)
    return at_most("aspect_ratio", ratio, t.max_aspect, "aspect ratio")
