"""The cheap CPU filters, each a small function writing a score, pass/fail and a reason."""

from __future__ import annotations

import cv2

from krea2.curate.config import StageThresholds
from krea2.curate.decode import DecodedImage
from krea2.curate.filters.animation import animation
from krea2.curate.filters.aspect import aspect_ratio
from krea2.curate.filters.base import FilterResult
from krea2.curate.filters.border import border
from krea2.curate.filters.complexity import complexity
from krea2.curate.filters.entropy import channel_histograms, entropy
from krea2.curate.filters.extremes import black, white
from krea2.curate.filters.flat import flat_color
from krea2.curate.filters.laplacian import laplacian
from krea2.curate.filters.resolution import resolution

# In report order; `broken` (a failed decode) comes before all of these.
CHEAP_FILTERS = (
    "resolution",
    "aspect_ratio",
    "animation",
    "laplacian",
    "entropy",
    "white_ratio",
    "black_ratio",
    "flat_color",
    "border",
    "complexity",
)


def run_cheap_filters(image: DecodedImage, t: StageThresholds) -> list[FilterResult]:
    """Every cheap filter on one decode, in ``CHEAP_FILTERS`` order. Grey and the channel
    histograms are computed once."""
    px = image.pixels
    grey = cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)
    hists = channel_histograms(px)
    return [
        resolution(image, t),
        aspect_ratio(image, t),
        animation(image, t),
        laplacian(grey, t),
        entropy(px, t, hists),
        white(px, t),
        black(px, t),
        flat_color(px, t, hists),
        border(px, grey, t),
        complexity(grey, t),
    ]


__all__ = ["CHEAP_FILTERS", "FilterResult", "run_cheap_filters"]
