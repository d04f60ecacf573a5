"""Style references for sampling: `IMG[:STRENGTH]` specs, images, and their latents."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from krea2.dit.autoencoder import Autoencoder
from krea2.dit.flag_values import split_number_suffix
from krea2.dit.sampler import check_style_times
from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from krea2.dit.sample_plan import SamplePlan
    from krea2.dit.style_module import StyleModule, StyleTokens


def parse_style_ref(spec: str) -> tuple[Path, float]:
    """'path.png:0.7' -> (Path('path.png'), 0.7); 'path.png' -> strength 1.0.

    The text after the last ':' is a strength only when it reads as a number, so a path
    that contains ':' otherwise stays whole. UserError for an empty path or a strength that
    is negative, nan or infinite.
    """
    path, strength = split_number_suffix(spec)
    tail = spec.rpartition(":")[2]
    if strength is None:
        strength = 1.0
    if not path:
        raise UserError(f"--style-ref {spec!r} names no image; write IMG[:STRENGTH] (a.png:0.7)")
    if not math.isfinite(strength) or strength < 0:
        raise UserError(
            f"--style-ref {spec!r}: strength {tail} must be a finite number >= 0 "
            "(0 = off, 1 = as trained)"
        )
    return Path(path), strength


def parse_style_times(spec: str) -> tuple[float, float]:
    """'0:0.8' -> (0.0, 0.8): the flow times (1 = noise) between which the references act
    (``--style-times``); UserError (one line) for anything else."""
    lo, sep, hi = spec.partition(":")
    try:
        if not sep:
            raise ValueError
        times = (float(lo), float(hi))
    except ValueError:
        raise UserError(
            f"--style-times {spec!r}: write LO:HI, flow times in [0, 1] (1 = noise), e.g. 0:0.8"
        ) from None
    return check_style_times(times)


def open_style_image(image: PILImage.Image | np.ndarray | str | Path) -> PILImage.Image:
    """An RGB PIL image from a PIL image, a uint8 array [H, W] or [H, W, 3|4], or a path;
    UserError (one line) for an unreadable or corrupt file or an unusable array."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or not (
            image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (3, 4))
        ):
            raise UserError(
                f"a style reference array must be uint8 [H, W] or [H, W, 3|4], got "
                f"{image.dtype} {image.shape}"
            )
        return Image.fromarray(image).convert("RGB")
    path = Path(image)
    try:
        with Image.open(path) as img:
            img.load()  # decode now: a truncated file fails here, not mid-sampling
            return img.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
        why = " ".join(str(e).split()) or type(e).__name__
        raise UserError(
            f"style reference {path}: cannot read the image ({why}); give a PNG, JPEG or WebP"
        ) from None


def style_reference_latents(
    images: Sequence[PILImage.Image | np.ndarray | str | Path],
    ae: Autoencoder,
    size: tuple[int, int],
) -> Tensor:
    """Latents [1, R, C, h, w] (float32, on the autoencoder's device) of R reference images.

    Each image is made RGB, scaled to cover `size` = (width, height) pixels (the sampling
    size) with Lanczos (anti-aliased when shrinking) and center-cropped, so nothing is
    stretched; then all are encoded in one batch by the frozen autoencoder (its mode, no
    sampling). h = height / f, w = width / f for the autoencoder's factor f.
    """
    from PIL import Image, ImageOps

    width, height = size
    if not images:
        raise UserError("no style reference images given")
    pixels = []
    for image in images:
        rgb = ImageOps.fit(open_style_image(image), (width, height), Image.Resampling.LANCZOS)
        pixels.append(torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1))
    x = torch.stack(pixels) / 127.5 - 1.0  # [R, 3, H, W] in [-1, 1]
    latents = ae.encode(x.to(_device_of(ae)))
    return latents.float()[None]


def _device_of(ae: Autoencoder) -> torch.device:
    """Where the autoencoder's weights live (CPU for one without any, e.g. PixelAE)."""
    if isinstance(ae, nn.Module):
        for t in [*ae.parameters(), *ae.buffers()]:
            return t.device
    return torch.device("cpu")


def load_style_refs(
    specs: Sequence[str], plan: SamplePlan
) -> tuple[list[tuple[PILImage.Image, float]], str]:
    """(image, strength) per ``--style-ref`` spec, every image decoded and the plan's style
    module (file, config, DiT) checked, all before the DiT loads; and what to tell the user
    ("" for nothing). UserError (one line) for each mistake."""
    from krea2.dit.release import read_dit_config
    from krea2.dit.style_module import read_style_config

    if not specs:
        if plan.style_module is not None:
            return [], f"no --style-ref: not using the style module {plan.style_module}"
        return [], ""
    parsed = [parse_style_ref(s) for s in specs]
    if plan.style_module is None:
        raise UserError(
            "--style-ref needs a style module made for this DiT: pass --style-module "
            "FILE.safetensors (or put style.safetensors in the --model folder)"
        )
    cfg = read_style_config(plan.style_module)
    cfg.check_matches(read_dit_config(plan.weights), f"style module {plan.style_module}")
    if len(parsed) > cfg.max_refs:
        raise UserError(
            f"{len(parsed)} --style-ref given, but the style module {plan.style_module} has "
            f"{cfg.max_refs} slots; give at most {cfg.max_refs}"
        )
    refs = [(open_style_image(path), s) for path, s in parsed]
    said = ", ".join(f"{path}:{s:g}" for path, s in parsed)
    return refs, f"style references {said} through {plan.style_module}"


def reference_tokens(
    module: StyleModule,
    refs: Sequence[tuple[PILImage.Image, float]],
    ae: Autoencoder,
    size: tuple[int, int],
) -> StyleTokens | None:
    """The one-image style tokens of ``refs`` (image, strength) at the sampling ``size``
    (width, height) through ``module``, on its device and dtype (None when every strength
    is 0: the exact path without style)."""
    p = next(module.parameters())
    latents = style_reference_latents([img for img, _ in refs], ae, size)
    strengths = torch.tensor([[s for _, s in refs]], device=p.device)
    with torch.no_grad():
        return module(latents.to(p.device, p.dtype), strengths)
