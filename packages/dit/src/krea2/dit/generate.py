"""Text-to-image generation: text encoder + DiT + Euler/CFG sampler + autoencoder -> images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from krea2.dit import flow
from krea2.dit.autoencoder import Autoencoder
from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import PixelAE, to_uint8
from krea2.dit.sampler import euler_sample, seeded_noise
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


def load_autoencoder(spec: str, dtype: torch.dtype, device: str) -> Autoencoder:
    """'pixel' | 'pixel:F' | 'qwen:PATH' | 'flux2:PATH' (PATH: a local diffusers folder)."""
    kind, _, arg = spec.partition(":")
    if kind == "pixel":
        return PixelAE(int(arg) if arg else 1)
    if kind == "qwen" and arg:
        from krea2.dit.vae import QwenImageVAE

        return QwenImageVAE.from_pretrained(arg, dtype=dtype).to(device)
    if kind == "flux2" and arg:
        from krea2.dit.vae import Flux2VAE

        return Flux2VAE.from_pretrained(arg, dtype=dtype).to(device)
    raise UserError(f"--ae {spec!r}: use 'pixel', 'pixel:F', 'qwen:PATH' or 'flux2:PATH'")


def load_text_encoder(
    spec: str, model: Krea2DiT, max_length: int, dtype: torch.dtype, device: str
) -> TextEncoder:
    """'tiny' | 'tiny:SEED' (tiny Qwen3-VL at the DiT's text shape) or a local Qwen3-VL folder."""
    cfg = model.cfg
    kind, _, arg = spec.partition(":")
    if kind == "tiny":
        enc = TextEncoder.tiny(cfg.text_dim, cfg.text_taps, max_length, seed=int(arg or 0))
        return enc.to(device)
    enc = TextEncoder.from_pretrained(spec, max_length=max_length, dtype=dtype, device=device)
    if enc.hidden_size != cfg.text_dim or len(enc.taps) != cfg.text_taps:
        raise UserError(
            f"text encoder {spec} gives {len(enc.taps)} taps x {enc.hidden_size}, the DiT "
            f"expects {cfg.text_taps} x {cfg.text_dim}"
        )
    return enc


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
    neg_txt = neg_mask = None
    if cfg != 0:
        neg_txt, neg_mask = encoder.encode([negative])
        neg_txt, neg_mask = neg_txt.to(device, dtype), neg_mask.to(device)

    def velocity(x, txt, t, mask):  # eager inference: skip padded text tokens
        return model.velocity(x, txt, t, mask, pack_text=True)

    latents = euler_sample(
        velocity, noise, times, txt.to(device, dtype), mask.to(device), cfg=cfg,
        neg_txt=neg_txt, neg_mask=neg_mask,
    )  # fmt: skip
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
