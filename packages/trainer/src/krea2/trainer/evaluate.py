"""Held-out flow loss at fixed times and noise, and sample grids from fixed prompts and seeds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from krea2.infra.errors import UserError
from krea2.trainer.build import TrainModule
from krea2.trainer.captions import choose_caption
from krea2.trainer.data import ShardIndex, StepBatches
from krea2.trainer.distributed import DistEnv, all_reduce_sum
from krea2.trainer.objective import flow_terms, sample_generator

EVAL_SEED_OFFSET = 7_919  # eval noise never coincides with training noise


def to_unit(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float [-1, 1]."""
    return pixels.float() / 127.5 - 1.0


@torch.no_grad()
def eval_loss(
    module: TrainModule,
    ae,
    index: ShardIndex,
    env: DistEnv,
    batches: int,
    times: list[float],
    seed: int,
    caption_weights: dict[str, float],
) -> float:
    """Weighted mean flow loss over the first ``batches`` batches of ``index`` (file order).

    Sample i of the held-out set always gets time ``times[i % len(times)]`` and the same
    noise and caption, so the number is comparable across steps and runs.
    """
    was_training = module.training
    module.eval()
    ds = StepBatches(index, env.dp_rank, env.dp, 0, min(batches, len(index)))
    total = torch.zeros(2, dtype=torch.float64, device=env.device)
    local = index.global_batch // env.dp
    for i in range(len(ds)):
        batch = ds[i]
        first = i * index.global_batch + env.dp_rank * local
        gens = [sample_generator(seed + EVAL_SEED_OFFSET, 0, first + j) for j in range(local)]
        latents = ae.encode(to_unit(batch["pixels"]).to(env.device))
        caps = [
            choose_caption(c, caption_weights, 0.0, g)
            for c, g in zip(batch["captions"], gens, strict=True)
        ]
        t = torch.tensor([times[(first + j) % len(times)] for j in range(local)])
        noise = torch.stack([torch.randn(latents.shape[1:], generator=g) for g in gens])
        dtype = next(module.dit.parameters()).dtype
        terms = flow_terms(
            lambda x, _txt, tt, _m, caps=caps: module(x, tt, caps)[0],
            latents.to(dtype),
            None,
            None,
            t,
            noise,
        )
        w = batch["weight"].to(env.device)
        total += torch.stack([(terms.per_sample * w).sum().double(), w.sum().double()])
    all_reduce_sum(total, env)
    module.train(was_training)
    return float(total[0] / total[1].clamp_min(1e-12))


# Sampling stacks several seeds' rows in one forward up to this many image tokens: the toy
# DiT samples ~30 % faster at 112-224 rows than at 28, and each row's image does not depend
# on its batch (seeded noise per row; pixel-identical on the demo's samples on Zen 4, the
# test allows the last bit of a matmul blocked for another batch size). A large image
# (4,096 tokens at 1024 px) keeps one seed per forward, as before.
SAMPLE_TOKENS_PER_FORWARD = 32_768


def seeds_per_forward(rows_per_seed: int, tokens: int, n_seeds: int) -> int:
    """How many seeds' rows (``rows_per_seed`` each, CFG's negatives included, of
    ``tokens`` image tokens) one forward takes: at least 1, at most ``n_seeds``."""
    fit = SAMPLE_TOKENS_PER_FORWARD // max(1, rows_per_seed * tokens)
    return max(1, min(n_seeds, fit))


@torch.no_grad()
def sample_grid(
    module: TrainModule,
    ae,
    prompts: list[str],
    seeds: list[int],
    size: tuple[int, int],
    steps: int,
    cfg_scale: float,
    mu: float,
    on_step: Callable[[], None] | None = None,
    style: tuple[Tensor, Tensor] | None = None,
    style_times: tuple[float, float] | None = None,
) -> np.ndarray:
    """Images for every (prompt, seed), uint8 [len(prompts), len(seeds), H, W, 3].

    Every rank runs the same sampling (FSDP and TP need all ranks in each forward).
    ``on_step()`` is called after each of the ``steps * len(seeds)`` Euler steps.
    ``style``: (reference latents [P or 1, R, C, h, w], strengths [P or 1, R]) for the
    module's style module, per prompt (or one set for all); with CFG both halves see them,
    so guidance amplifies the prompt, not the reference; ``style_times`` (lo, hi): only
    while the flow time is in [lo, hi] (:func:`krea2.dit.timed_style`; None: every step).
    Several seeds share a forward
    (:func:`seeds_per_forward`); an image is the same whichever others share it.
    """
    from krea2.dit import flow, timed_style
    from krea2.dit.pixel_ae import to_uint8
    from krea2.dit.sampler import euler_sample, seeded_noise, with_cfg

    was_training = module.training
    module.eval()
    device = next(module.dit.parameters()).device
    dtype = next(module.dit.parameters()).dtype
    w, h = size
    f = ae.spatial_factor
    shape = (ae.latent_channels, h // f, w // f)
    copies = 2 if cfg_scale != 0 else 1  # with CFG: rows [prompts; negatives] (with_cfg)
    tokens = (h // f // module.dit.cfg.patch) * (w // f // module.dit.cfg.patch)
    per_forward = seeds_per_forward(copies * len(prompts), tokens, len(seeds))

    refs = strengths = None
    if style is not None:
        if module.style is None:
            raise UserError("style references given to a module without a style module")
        refs, strengths = (v.to(device) for v in style)
        refs = refs.to(dtype).expand(len(prompts), *refs.shape[1:])
        strengths = strengths.float().expand(len(prompts), strengths.shape[-1])

    def velocity_for(k: int):
        """The velocity of ``k`` seeds' rows: the prompts repeated k times (then as many
        negatives with CFG), style tokens made once for them (they do not depend on t)."""
        rows = list(prompts) * k
        captions = [*rows, *[""] * len(rows)] if cfg_scale != 0 else rows
        extra = {}
        if refs is not None:
            r = torch.cat([refs] * (k * copies))
            s = torch.cat([strengths] * (k * copies))
            extra = {"style_tokens": module.style(r, s)}

        def module_velocity(x, t):  # the module encodes its captions itself
            return module(x, t, captions, None, **extra)[0]

        velocity = module_velocity
        if extra and style_times is not None:
            velocity = timed_style(module_velocity, lambda x, t: module(x, t, captions)[0],
                                   style_times)  # fmt: skip
        return with_cfg(velocity, cfg_scale) if cfg_scale != 0 else velocity

    velocities: dict[int, Callable] = {}
    per_seed = []
    for first in range(0, len(seeds), per_forward):
        chunk = seeds[first : first + per_forward]
        k = len(chunk)
        if k not in velocities:
            velocities[k] = velocity_for(k)
        noise = seeded_noise([s for s in chunk for _ in prompts], shape).to(device, dtype)

        def each_seed(_i, _x, k=k):
            for _ in range(k):
                on_step()

        x0 = euler_sample(
            velocities[k],
            noise,
            flow.sampling_times(steps, mu),
            on_step=None if on_step is None else each_seed,
        )
        images = to_uint8(ae.decode(x0.float())).numpy()
        per_seed += list(images.reshape(k, len(prompts), *images.shape[1:]))
    module.train(was_training)
    return np.stack(per_seed, axis=1)


def save_grid(images: np.ndarray, prompts: list[str], path: Path, info: dict | None = None) -> Path:
    """Write a PNG grid (rows = prompts, columns = seeds) with each row's prompt written
    under it, and the prompts (plus ``info``) as JSON beside it.

    ``images``: uint8 [len(prompts), seeds, H, W, 3]; tiles are scaled up (nearest) to about
    256 px so toy images and their captions stay readable.
    """
    from PIL import Image, ImageDraw, ImageFont

    n, s, h, w, _ = images.shape
    scale = max(1, 256 // max(h, w))
    tile_h, tile_w, pad = h * scale, w * scale, 4
    width = s * (tile_w + pad) + pad
    font = ImageFont.load_default(size=14)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    captions = [_wrap(p, width - 2 * pad, measure, font) for p in prompts]
    line_h = 18
    height = pad + sum(tile_h + pad + line_h * len(c) + pad for c in captions)
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    y = pad
    for i in range(n):
        for j in range(s):
            tile = Image.fromarray(images[i, j]).resize((tile_w, tile_h), Image.Resampling.NEAREST)
            canvas.paste(tile, (pad + j * (tile_w + pad), y))
        y += tile_h + pad
        for line in captions[i]:
            draw.text((pad, y), line, fill=(0, 0, 0), font=font)
            y += line_h
        y += pad
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    record = {"prompts": prompts, **(info or {})}
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return path


def _wrap(text: str, width_px: int, draw, font) -> list[str]:
    """``text`` broken at spaces into lines at most ``width_px`` wide (a long word alone)."""
    lines: list[str] = []
    for word in text.split() or [""]:
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width_px:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines
