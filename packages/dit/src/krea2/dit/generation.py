"""Text-to-image generation: text encoder + DiT + Euler/CFG sampler + autoencoder -> images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

import krea2.dit.flow as flow
from krea2.dit.autoencoder import Autoencoder
from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import to_uint8
from krea2.dit.sampler import (
    Velocity,
    dit_velocity,
    euler_sample,
    from_x0,
    seeded_noise,
    with_cfg,
    with_negative,
)
from krea2.dit.style_module import StyleTokens
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


PREDICTIONS = ("velocity", "x0")  # DiT outputs `generate` can sample from


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
    mu: float | flow.TimeShift | None = None,
    negative: str = "",
    *,
    prediction: str = "velocity",
    x0_min_t: float = 0.05,
    batch_size: int | None = None,
    progress: bool = False,
    style: StyleTokens | None = None,
    seeds: Sequence[int] | None = None,
    style_times: tuple[float, float] | None = None,
) -> Tensor:
    """Images [B, 3, H, W] in [-1, 1] on the CPU; image i uses seed + i, or `seeds[i]`
    when `seeds` (one per prompt) is given (a server batching requests with their own seeds).

    `mu`: a fixed time shift, a `flow.TimeShift` rule, or None for the release's resolution
    line. `prediction`: what the DiT outputs, `velocity` or `x0` (turned into v with the
    floor `x0_min_t`). `batch_size`: prompts per forward (None: all at once); an image does
    not depend on its batch. `progress`: report denoising steps x batches through
    `krea2.infra.progress` (a bar on a terminal, plain lines otherwise); silent by default.

    `style`: the StyleTokens of ONE image ([1, S, D] and bias [1, S], from a StyleModule on
    `style_reference_latents`), broadcast to every image. Under CFG they condition both
    halves, the prompt and the negative, so guidance amplifies the prompt, not the
    reference (the reference's weight is its strength alone). None: no reference, the exact
    path without style. `style_times` (lo, hi): the reference acts only while the flow time
    t is in [lo, hi] (1 = noise; 0 <= lo <= hi <= 1), the exact path without it elsewhere;
    None: at every step.
    """
    from krea2.infra.progress import progress as progress_bar

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
    if prediction not in PREDICTIONS:
        raise UserError(f"prediction {prediction!r}: choose one of {', '.join(PREDICTIONS)}")
    if style is not None and (style.tokens.ndim != 3 or style.tokens.shape[0] != 1):
        raise UserError(
            f"generate takes the style tokens of one image ([1, S, D]), got "
            f"{tuple(style.tokens.shape)}; they are broadcast to every prompt"
        )
    tokens = (height // factor) * (width // factor)
    shift = mu if isinstance(mu, flow.TimeShift) else flow.TimeShift(fixed=mu)
    times = flow.sampling_times(steps, shift.mu(tokens))
    prompts = list(prompts)
    seeds = list(seeds) if seeds is not None else [seed + i for i in range(len(prompts))]
    if len(seeds) != len(prompts):
        raise UserError(f"{len(seeds)} seeds for {len(prompts)} prompts; give one per prompt")
    size = batch_size or max(1, len(prompts))
    if size <= 0:
        raise UserError(f"batch size {batch_size} must be positive")
    starts = range(0, len(prompts), size)
    images = []
    with progress_bar(
        f"sample {width}x{height}", total=steps * len(starts), unit="step", enabled=progress
    ) as bar:
        for start in starts:
            batch = prompts[start : start + size]
            noise = _noise(model, ae, seeds[start : start + len(batch)], width, height)
            velocity = _velocity(model, encoder, batch, cfg, negative, prediction, x0_min_t,
                                 style, style_times)  # fmt: skip
            latents = euler_sample(
                velocity, noise, times,
                on_step=lambda i, x: bar.advance(),
            )  # fmt: skip
            images.append(ae.decode(latents).float().cpu())
    return torch.cat(images)


def _noise(model: Krea2DiT, ae: Autoencoder, seeds: list[int], width: int, height: int) -> Tensor:
    p = next(model.parameters())
    f = ae.spatial_factor
    return seeded_noise(seeds, (ae.latent_channels, height // f, width // f), p.dtype, p.device)


def _velocity(
    model: Krea2DiT,
    encoder: TextEncoder,
    prompts: list[str],
    cfg: float,
    negative: str,
    prediction: str,
    x0_min_t: float,
    style: StyleTokens | None = None,
    style_times: tuple[float, float] | None = None,
) -> Velocity:
    """The velocity of `model` conditioned on `prompts` (and on `negative` under CFG), and
    on the one-image `style` tokens for every row (both CFG halves) while the flow time is
    within `style_times` (None: always)."""
    p = next(model.parameters())
    txt, mask = encoder.encode(prompts)
    txt, mask = txt.to(p.device, p.dtype), mask.to(p.device)
    if cfg != 0:
        neg_txt, neg_mask = encoder.encode([negative])
        txt, mask = with_negative(txt, mask, neg_txt.to(p.device, p.dtype), neg_mask.to(p.device))
    if style is not None:  # one image's tokens for every row of the (doubled) batch
        style = style.to(p.device, p.dtype).broadcast(txt.shape[0])
    # eager: pack_text skips the pads
    velocity = dit_velocity(model, txt, mask, pack_text=True, style=style, style_times=style_times)
    if prediction == "x0":
        velocity = from_x0(velocity, x0_min_t)
    return with_cfg(velocity, cfg) if cfg != 0 else velocity


def save_pngs(images: Tensor, out: Path, seeds: Sequence[int]) -> list[Path]:
    """Write [B, 3, H, W] images in [-1, 1] as OUT/NNN-seedS.png; returns the paths.

    Each file is written under a temporary name and renamed, so an interrupted run leaves
    whole images or none (never a truncated PNG).
    """
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (img, s) in enumerate(zip(to_uint8(images), seeds, strict=True)):
        p = out / f"{i:03d}-seed{s}.png"
        tmp = out / f".{p.name}.tmp"
        try:
            Image.fromarray(img.numpy()).save(tmp, format="PNG")
            tmp.replace(p)
        finally:
            tmp.unlink(missing_ok=True)
        paths.append(p)
    return paths
