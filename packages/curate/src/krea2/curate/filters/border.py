"""Border filter: uniform edge bands (letterboxing, frames, padding) ending in a hard line."""

from __future__ import annotations

import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_most
from krea2.curate.pixel_pass import frozen
from krea2.curate.planes import LineStats, planes
from krea2.curate.score_kernels import widest_band


def border_fraction(pixels: np.ndarray, lines: LineStats | None = None) -> float:
    """Widest hard-edged uniform band over the four edges, as a share of that dimension.
    ``pixels`` (h, w, 3) uint8 RGB; ``lines`` their grey row/column statistics
    (``Planes.lines``) if already computed."""
    if lines is None:
        lines = planes(pixels).lines
    means_stds = (lines.row_mean, lines.row_std, lines.col_mean, lines.col_std)
    stats = (frozen(v, np.float64) for v in means_stds)
    return float(widest_band(frozen(pixels), *stats))


def border(score: float, t: StageThresholds) -> FilterResult:
    """Fail when ``score`` (``border_fraction``; ``Planes.border_fraction``) is above
    ``max_border_fraction``."""
    return at_most("border", score, t.max_border_fraction, "border band share")
