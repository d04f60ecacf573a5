"""Cheap image features for the reward heads: sharpness, noise, colour, borders, shape quality.

Each image is resized to ``FEATURE_SIDE``² first, so features do not depend on resolution.
No learned encoder: on ShapesWorld these hand-made statistics separate the structural
defects (noise, blur, borders, broken shapes) well, and they cost about a millisecond each.
"""

from __future__ import annotations

import cv2
import numpy as np

from krea2.curate import shapes

FEATURE_SIDE = 64
FEATURE_NAMES: tuple[str, ...] = (
    "lap_mean",  # mean |Laplacian|: noise raises it, blur lowers it
    "lap_median",  # median |Laplacian|: noise raises it even on mostly flat images
    "lap_std",
    "flat_share",  # share of pixels with gradient < 2
    "edge_share",  # share with gradient > 30 (sharp edges)
    "edge_sharpness",  # strong-edge share / any-edge share: blur lowers it
    "residual",  # mean |image - 3x3 median|: impulse and fine noise
    "colours",  # distinct colours after 3-bit quantization, / 512
    "mean_r",
    "mean_g",
    "mean_b",
    "std_r",
    "std_g",
    "std_b",
    "saturation",
    "border_step",  # strongest full-width straight edge near a side, after a uniform band
    "objects",  # detected ShapesWorld objects
    "shape_fit_min",  # worst object's best template IoU (broken shapes lower it)
    "shape_fit_mean",
)


def _border_step(gray: np.ndarray) -> float:
    """Largest mean step between row/col ``d-1`` and ``d`` (``d`` up to 20% in from a side)
    where rows/cols ``0..d-1`` form one uniform band: a letterbox, pillarbox or frame."""
    best = 0.0
    side = gray.shape[0]
    for view in (gray, gray[::-1], gray.T, gray.T[::-1]):
        band_mean = view[0].mean()
        for d in range(1, max(2, side // 5)):
            row = view[d - 1]
            if row.std() > 4.0 or abs(row.mean() - band_mean) > 4.0:
                break
            best = max(best, float(np.abs(view[d] - row).mean()))
    return best / 255.0


def _shape_features(pixels: np.ndarray) -> tuple[float, float, float]:
    objects = shapes.detect_objects(pixels)
    fits = [max(o.shape_scores.values()) for o in objects] or [1.0]
    return float(len(objects)), float(min(fits)), float(np.mean(fits))


def image_features(pixels: np.ndarray) -> np.ndarray:
    """``[B, len(FEATURE_NAMES)]`` float32 features of uint8 ``[B, H, W, 3]`` RGB images."""
    out = np.zeros((pixels.shape[0], len(FEATURE_NAMES)), np.float32)
    for i, image in enumerate(pixels):
        small = cv2.resize(image, (FEATURE_SIDE, FEATURE_SIDE), interpolation=cv2.INTER_AREA)
        f = small.astype(np.float32)
        gray = f.mean(axis=2)
        lap = np.abs(cv2.Laplacian(gray, cv2.CV_32F))
        gx, gy = cv2.Sobel(gray, cv2.CV_32F, 1, 0) / 4, cv2.Sobel(gray, cv2.CV_32F, 0, 1) / 4
        grad = np.hypot(gx, gy)
        edges, strong = (grad > 6).mean(), (grad > 30).mean()
        residual = np.abs(f - cv2.medianBlur(small, 3).astype(np.float32)).mean()
        q = (small >> 5).astype(np.int32).reshape(-1, 3)
        colours = len(np.unique(q[:, 0] * 64 + q[:, 1] * 8 + q[:, 2])) / 512
        hsv = cv2.cvtColor(small, cv2.COLOR_RGB2HSV)
        out[i] = (
            lap.mean() / 255,
            np.median(lap) / 255,
            lap.std() / 255,
            (grad < 2).mean(),
            strong,
            strong / max(edges, 1e-3),
            residual / 255,
            colours,
            *(f.mean(axis=(0, 1)) / 255),
            *(f.std(axis=(0, 1)) / 255),
            hsv[..., 1].mean() / 255,
            _border_step(gray),
            *_shape_features(small),
        )
    return out
