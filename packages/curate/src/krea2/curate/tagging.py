"""Concept taggers: pixels → a set of concept tags, the input of concept rebalancing."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Tagger(Protocol):
    """Anything that tags (h, w, 3) uint8 RGB pixels with concept names."""

    def __call__(self, pixels: np.ndarray) -> frozenset[str]: ...


def shapes_tagger(pixels: np.ndarray) -> frozenset[str]:
    """ShapesWorld tags: each colour+shape the verifier's analysis finds, e.g. "red circle"."""
    from krea2.curate.shapes.analyze import analyze

    return frozenset(f"{o.color} {o.shape}" for o in analyze(pixels))
