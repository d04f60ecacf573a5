"""Copies that hash dedup misses: crops of more than 5%, flips and colour-preserving edits.

Part 1's hashes (12×12 phash + colorhash + an 8×8 phash veto) tolerate about a 1% crop and
a 0.5% shift (docs/curate.md). The copies here move content much further, so only an
embedding that was taught these edits (``krea2.curate.embed.ssl``) finds them. Each edit
keeps every object's colour: a recoloured ShapesWorld scene is a different scene.
"""

from __future__ import annotations

import cv2
import numpy as np

# How a copy is made; ``copy_edit`` draws its strength.
COPY_EDITS: tuple[str, ...] = ("crop", "flip", "tone", "degrade", "crop_flip")


def _crop(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Keep 78–92% of each side (8–22% of the side cut, 15–40% of the area), off-centre."""
    h, w = pixels.shape[:2]
    kh, kw = (round(s * rng.uniform(0.78, 0.92)) for s in (h, w))
    y = int(rng.integers(0, h - kh + 1))
    x = int(rng.integers(0, w - kw + 1))
    return pixels[y : y + kh, x : x + kw]


def _tone(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness, contrast and gamma, the same curve on every channel (hue is kept)."""
    x = pixels.astype(np.float32) / 255.0
    gamma = rng.uniform(0.7, 1.4)
    contrast = rng.uniform(0.7, 1.3)
    brightness = rng.uniform(-0.12, 0.12)
    x = (x**gamma - 0.5) * contrast + 0.5 + brightness
    return (np.clip(x, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _degrade(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur, a downscale-upscale round trip and added noise."""
    h, w = pixels.shape[:2]
    sigma = rng.uniform(1.5, 3.0)
    out = cv2.GaussianBlur(pixels, (0, 0), sigma)
    f = rng.uniform(0.35, 0.6)
    small = cv2.resize(out, (max(8, int(w * f)), max(8, int(h * f))), interpolation=cv2.INTER_AREA)
    out = cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR).astype(np.float32)
    out += rng.normal(0.0, rng.uniform(3.0, 8.0), out.shape).astype(np.float32)
    return np.clip(out, 0, 255).astype(np.uint8)


def copy_edit(pixels: np.ndarray, edit: str, rng: np.random.Generator) -> np.ndarray:
    """(h, w, 3) uint8 RGB → the copy made by ``edit`` (one of ``COPY_EDITS``), uint8 RGB
    (a crop is smaller)."""
    if edit == "crop":
        return _crop(pixels, rng)
    if edit == "flip":
        return np.ascontiguousarray(pixels[:, ::-1])
    if edit == "tone":
        return _tone(pixels, rng)
    if edit == "degrade":
        return _degrade(pixels, rng)
    if edit == "crop_flip":
        return np.ascontiguousarray(_crop(pixels, rng)[:, ::-1])
    raise ValueError(f"unknown copy edit {edit!r}; known: {COPY_EDITS}")
