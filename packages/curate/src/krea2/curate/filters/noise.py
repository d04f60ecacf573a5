"""Noise-pattern filter: an image whose pixels do not predict their neighbours.

A photograph's spectrum falls with frequency, so neighbouring pixels are strongly correlated
even in grass, gravel or foliage; a noise pattern's are not, and reducing it to the analysis
size leaves it white. The correlation is a property of the image, not of its amplitude or
size, where the Laplacian's variance is both: a detailed photo and a large noise image can
score the same (measured in ``benchmarks/curate_filters.py``).
"""

from __future__ import annotations

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_least


def noise(score: float, t: StageThresholds) -> FilterResult:
    """Fail when ``score`` (``pixel_pass.neighbour_correlation`` of the analysis grey;
    ``Planes.neighbour_corr``) is below ``min_neighbour_corr``."""
    return at_least("noise", score, t.min_neighbour_corr, "neighbour correlation")
