"""Text-to-image generation: text encoder + DiT + Euler/CFG sampler + autoencoder -> images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from krea2.dit import flow
from krea2.dit.autoencoder import Autoencoder
from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import to_uint8
from krea2.dit.sampler import dit_velocity, euler_sample, seeded_noise, with_cfg, with_negative
from krea2.dit.text import TextEncoder
from krea2.infra.errors import UserError


def parse_size(size: str) -> tuple[int, int]:
    """'1024x768' -> (width 1024, height 768)."""
    try:
        w, h = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise UserError(f"--size {size!r} must look like WIDTHxHEIGHT, e.g. 1024x768") from None
    if w <= 0 or h <= 0:
        raise UserError(f"--size {size!r} must be positive")
    return w, h


@torch.no_grad()
def generate(
    model: Krea2DiT,
    encoder: TextEncoder,
    ae: Autoencoder,
    prompts: Sequence[str],
    width: int,
    height: int,
    steps: int = 28,
    cfg: float = 4.5,
    seed: int = 0,
    mu: float | None = None,
    negative: str = "",
) -> Tensor:
    """Images [B, 3, H, W] in [-1, 1]; image i uses seed + i. mu None: from the resolution."""
    factor = ae.spatial_factor * model.cfg.patch
    if width % factor or height % factor:
        raise UserError(
            f"size {width}x{height} is not divisible by {factor} (autoencoder factor "
            f"{ae.spatial_factor} x patch {model.cfg.patch}); use a multiple of {factor}"
        )
    if ae.latent_channels != model.cfg.latent_channels:
        raise UserError(
            f"the autoencoder has {ae.latent_channels} latent channels, the DiT expects "
            f"{model.cfg.latent_channels}; pick the matching --ae"
        )
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    tokens = (height // factor) * (width // factor)
    mu = flow.resolution_mu(tokens) if mu is None else mu
    times = flow.sampling_times(steps, mu)
    f = ae.spatial_factor
    shape = (ae.latent_channels, height // f, width // f)
    noise = seeded_noise([seed + i for i in range(len(prompts))], shape, dtype, device)
    txt, mask = encoder.encode(list(prompts))
    txt, mask = txt.to(device, dtype), mask.to(device)
    if cfg != 0:
        neg_txt, neg_mask = encoder.encode([negative])
        txt, mask = with_negative(txt, mask, neg_txt.to(device, dtype), neg_mask.to(device))
    velocity = dit_velocity(model, txt, mask, pack_text=True)  # eager: skip padded text
    if cfg != 0:
        velocity = with_cfg(velocity, cfg)
    latents = euler_sample(velocity, noise, times)
    return ae.decode(latents)


def save_pngs(images: Tensor, out: Path, seeds: Sequence[int]) -> list[Path]:
    """Write [B, 3, H, W] images in [-1, 1] as OUT/NNN-seedS.png; returns the paths."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (img, s) in enumerate(zip(to_uint8(images), seeds, strict=True)):
        p = out / f"{i:03d}-seed{s}.png"
        Image.fromarray(img.numpy()).save(p)
        paths.append(p)
    return paths
