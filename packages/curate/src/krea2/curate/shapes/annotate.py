"""ShapesWorld's tagger and captioner, registered as ``shapes`` in ``krea2.curate.plugins``."""

from __future__ import annotations

import numpy as np

from krea2.curate.shapes.captions import captions
from krea2.curate.shapes.detect import detect_objects
from krea2.curate.shapes.spec import Scene


def shapes_tagger(pixels: np.ndarray) -> frozenset[str]:
    """Each colour+shape the verifier's detection finds in (h, w, 3) uint8 RGB ``pixels``,
    e.g. "red circle"."""
    return frozenset(f"{o.color} {o.shape}" for o in detect_objects(pixels))


def shapes_captioner(uri: str, meta: dict | None) -> dict[str, str]:
    """The five caption formats of the scene spec in the image's metadata (``meta["scene"]``,
    as ``write_pool`` puts it in each image's sidecar); ``{}`` for an image without one."""
    scene = (meta or {}).get("scene")
    return captions(Scene.from_dict(scene)) if scene else {}
