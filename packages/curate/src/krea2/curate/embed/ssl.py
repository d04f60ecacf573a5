"""Self-supervised training of the toy encoder on a pool: SimCLR-style instance discrimination.

Two random views of each image are pulled together and pushed away from every other image
of the batch (InfoNCE over L2-normalised embeddings, temperature ``temperature``). The views
are the edits a copy goes through: crops (70–100% of each side, any offset), horizontal
flips, brightness/contrast/gamma applied equally to every channel, and blur, downscaling and
noise. Hue is never changed, so colour stays part of an image's identity (a recoloured
ShapesWorld scene is a different scene). This is the SSCD recipe (copy detection by
instance discrimination over copy edits) at toy scale.

After training, ``calibrate_threshold`` sets the copy threshold from the pool alone, as
the similarity that 95% of fresh policy-strength copies of pool images exceed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from krea2.curate.embed.toy import ToyEncoder, ToyEncoderConfig

SOURCE_MARGIN = 1.25  # sources are kept at this × the input side, so crops still hold detail
# Training views crop harder than what we call a copy (a margin for invariance); the copy
# threshold is measured on copies as the policy defines them: at least 78% of each side kept.
TRAIN_MIN_KEPT = 0.7
COPY_MIN_KEPT = 0.78
# The threshold lets this share of policy copies fall below it: a lower one admits the
# hardest distinct pairs (similar layouts), which costs more precision than it buys recall.
COPY_QUANTILE = 0.05


@dataclass(frozen=True)
class SslConfig:
    """Training settings: ``steps`` of ``batch`` images (2 views each), AdamW at ``lr`` with
    a cosine decay, InfoNCE ``temperature``; ``threads``: torch intra-op threads."""

    steps: int = 600
    batch: int = 128
    lr: float = 2e-3
    weight_decay: float = 1e-4
    temperature: float = 0.07
    seed: int = 0
    threads: int = 1
    # Whether a mirrored image counts as a copy. Off where position is part of what an image
    # shows (ShapesWorld's captions say "on the left"): there the mirror of a one-object
    # scene is another scene of the pool, pixel for pixel.
    flips: bool = True


def to_sources(images: Sequence[np.ndarray], side: int) -> torch.Tensor:
    """(h, w, 3) uint8 images → (n, 3, s, s) float [0, 1], squashed to ``side·SOURCE_MARGIN``."""
    s = round(side * SOURCE_MARGIN)
    arr = np.stack([cv2.resize(im, (s, s), interpolation=cv2.INTER_AREA) for im in images])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).float().div_(255.0)


def augment(
    src: torch.Tensor,
    side: int,
    gen: torch.Generator,
    min_kept: float = TRAIN_MIN_KEPT,
    flips: bool = True,
) -> torch.Tensor:
    """(b, 3, S, S) float [0, 1] → one random copy-edit view per image, (b, 3, side, side);
    a crop keeps at least ``min_kept`` of each side; half the views are mirrored if
    ``flips``."""
    b = src.shape[0]

    def u(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(b, generator=gen)

    sx, sy = u(min_kept, 1.0), u(min_kept, 1.0)  # kept share of each side
    tx, ty = (1 - sx) * u(-1, 1), (1 - sy) * u(-1, 1)
    flip = torch.where(torch.rand(b, generator=gen) < (0.5 if flips else 0.0), -1.0, 1.0)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = sx * flip, tx
    theta[:, 1, 1], theta[:, 1, 2] = sy, ty
    grid = F.affine_grid(theta, [b, 3, side, side], align_corners=False)
    x = F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=False)
    # Tone: one curve for all channels (hue kept).
    gamma, contrast, bright = u(0.6, 1.6), u(0.6, 1.4), u(-0.15, 0.15)
    x = x.clamp_min(1e-4) ** gamma[:, None, None, None]
    x = (x - 0.5) * contrast[:, None, None, None] + 0.5 + bright[:, None, None, None]
    # Degrade a third of the views: a downscale round trip (blur) and noise.
    soft = torch.rand(b, generator=gen) < 0.33
    if soft.any():
        f = float(u(0.25, 0.6)[0])
        small = F.interpolate(x[soft], scale_factor=f, mode="area")
        x[soft] = F.interpolate(small, size=(side, side), mode="bilinear", align_corners=False)
    noise = torch.randn(x.shape, generator=gen) * u(0.0, 0.03)[:, None, None, None]
    return (x + noise).clamp(0.0, 1.0)


def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE of paired views a, b (n, d), normalised inside: view i of a must
    find view i of b among all 2n − 1 other views."""
    z = F.normalize(torch.cat([a, b]), dim=1)
    n = a.shape[0]
    logits = z @ z.T / temperature
    logits.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(logits, target)


def train_toy_encoder(
    images: Sequence[np.ndarray],
    model_config: ToyEncoderConfig | None = None,
    config: SslConfig | None = None,
    log: Callable[[int, float], None] | None = None,
) -> tuple[ToyEncoder, dict]:
    """Train a ``ToyEncoder`` on (h, w, 3) uint8 ``images`` and set its copy threshold.
    Returns (the model in eval mode, stats: losses, seconds, threshold, similarities)."""
    mc, c = model_config or ToyEncoderConfig(), config or SslConfig()
    if len(images) < 2:
        raise ValueError(f"self-supervised training needs at least 2 images, got {len(images)}")
    previous = torch.get_num_threads()
    torch.set_num_threads(c.threads)
    try:
        torch.manual_seed(c.seed)
        gen = torch.Generator().manual_seed(c.seed)
        src = to_sources(images, mc.side)
        model = ToyEncoder(mc)
        opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=c.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / c.steps))
        )
        batch = min(c.batch, len(src))
        losses: list[float] = []
        start = time.perf_counter()
        model.train()
        for step in range(c.steps):
            idx = torch.randperm(len(src), generator=gen)[:batch]
            a = model(augment(src[idx], mc.side, gen, flips=c.flips))
            b = model(augment(src[idx], mc.side, gen, flips=c.flips))
            loss = info_nce(a, b, c.temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            if log is not None:
                log(step, losses[-1])
        seconds = time.perf_counter() - start
        model.eval()
        threshold, sims = calibrate_threshold(model, src, gen, flips=c.flips)
        model.config = replace(mc, threshold=threshold)
    finally:
        torch.set_num_threads(previous)
    stats = {"losses": losses, "seconds": seconds, "threshold": threshold, **sims}
    return model, stats


@torch.inference_mode()
def _embed(model: ToyEncoder, x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    return F.normalize(torch.cat([model(x[i : i + chunk]) for i in range(0, len(x), chunk)]))


@torch.inference_mode()
def calibrate_threshold(
    model: ToyEncoder, src: torch.Tensor, gen: torch.Generator, views: int = 4, flips: bool = True
) -> tuple[float, dict]:
    """The cosine threshold above which two images are copies, from the pool alone: the
    ``COPY_QUANTILE`` quantile of the similarity between each image and ``views`` fresh
    copies of it made as the copy policy defines them (crops keeping ≥ ``COPY_MIN_KEPT`` of
    each side, flips, tone, blur; ``augment``), so 95% of such copies score above it.
    Returns (threshold, {copy_q, copy_p50, nearest_p50}: quantiles of copies and of each
    image's nearest other image, for the record)."""
    side = model.config.side
    plain = F.interpolate(src, size=(side, side), mode="area")
    ref = _embed(model, plain)
    pos = torch.cat(
        [
            (_embed(model, augment(src, side, gen, COPY_MIN_KEPT, flips)) * ref).sum(1)
            for _ in range(views)
        ]
    )
    sim = ref @ ref.T
    sim.fill_diagonal_(-1.0)
    threshold = float(torch.quantile(pos, COPY_QUANTILE))
    stats = {
        "copy_q": threshold,
        "copy_p50": float(pos.median()),
        "nearest_p50": float(sim.max(1).values.median()),
    }
    return threshold, stats
