"""Resolution filter: the original's shorter side must reach the stage's minimum."""

from __future__ import annotations

from krea2.curate.config import StageThresholds
from krea2.curate.decode import DecodedImage
from krea2.curate.filters.base import FilterResult, at_least


def resolution(image: DecodedImage, t: StageThresholds) -> FilterResult:
    """Score: shorter side of the original in px."""
    side = min(image.width, image.height)
    return at_least("resolution", side, t.min_side, "shorter side px")
