"""Laplacian-variance filter: extreme textures and noise patterns have huge local contrast."""

from __future__ import annotations

import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most
from krea2.curate.pixel_pass import laplacian_tiles


def laplacian_variance(grey: np.ndarray) -> float:
    """Median over an 8×8 grid of tiles of the 3×3 Laplacian's variance, in grey levels²
    (``pixel_pass.laplacian_tiles``; the whole image's variance when it is under 16 px).

    The median, not the global variance: an extreme texture or noise pattern covers the
    whole frame, while a photo with one detailed region or a block of text does not.
    """
    return float(np.median(laplacian_tiles(grey)))


def laplacian(score: float, t: StageThresholds) -> FilterResult:
    """Fail when ``score`` (``laplacian_variance``; ``Planes.laplacian_var``) is above
    ``max_laplacian_var``. Low variance (blur) is kept on purpose: softness can be
    deliberate, and the report never filters on it."""
    return at_most("laplacian", score, t.max_laplacian_var, "laplacian var")
