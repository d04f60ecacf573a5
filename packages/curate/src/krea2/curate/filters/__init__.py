"""The cheap CPU filters, each a small function writing a score, pass/fail and a reason."""

from __future__ import annotations

from krea2.curate.config import StageThresholds
from krea2.curate.decode import DecodedImage
from krea2.curate.filters.animation import animation
from krea2.curate.filters.aspect import aspect_ratio
from krea2.curate.filters.base import FilterResult
from krea2.curate.filters.border import border
from krea2.curate.filters.complexity import complexity
from krea2.curate.filters.entropy import entropy
from krea2.curate.filters.extremes import black, white
from krea2.curate.filters.flat import flat_color
from krea2.curate.filters.laplacian import laplacian
from krea2.curate.filters.noise import noise
from krea2.curate.filters.resolution import resolution
from krea2.curate.planes import Planes, planes
from krea2.curate.stages import CHEAP_FILTERS  # in report order; `broken` comes before all


def run_cheap_filters(
    image: DecodedImage, t: StageThresholds, shared: Planes | None = None
) -> list[FilterResult]:
    """Every cheap filter on one decode, in ``CHEAP_FILTERS`` order. Grey, the channel
    histograms, the white/black counts and the line statistics come from ``shared`` (the
    image's ``planes``, computed here when not given)."""
    px = image.pixels
    p = planes(px) if shared is None else shared
    n = p.colours.pixels
    return [
        resolution(image, t),
        aspect_ratio(image, t),
        animation(image, t),
        noise(p.neighbour_corr, t),
        laplacian(p.laplacian_var, t),
        entropy(p.entropy, t),
        white(px, t, p.colours.white / n),
        black(px, t, p.colours.black / n),
        flat_color(p.flat_ratio, t),
        border(p.border_fraction, t),
        complexity(p.grey, t),
    ]


__all__ = ["CHEAP_FILTERS", "FilterResult", "run_cheap_filters"]
