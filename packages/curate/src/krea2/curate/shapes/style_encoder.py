"""A toy CSD: a small contrastive style encoder trained on ShapesWorld renders (needs torch).

CSD (contrastive style descriptors) embeds images so that two images of one style are
close whatever they show. Here the styles are ``styles.StyleSpec`` and the training pairs
are one style applied to two different random scenes: InfoNCE pulls each pair together
and pushes it from the batch's other styles (a batch holds styles in twins that differ only
in object style, so filled vs outlined is learnt too). Three stride-2 convolutions, then
the mean, standard deviation and maximum of the last feature map over all positions (no
layout survives the pooling), then a linear map to a unit-length ``dim``-vector.

Needs the ``embed`` extra (torch, safetensors); nothing else in ``krea2.curate.shapes``
imports this module, and the package exports its names lazily.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from krea2.curate.shapes.render import render
from krea2.curate.shapes.sample import sample_scene
from krea2.curate.shapes.style_measures import check_image
from krea2.curate.shapes.styles import StyleSpec, apply_style, sample_style

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class StyleEncoderConfig:
    """``side``: input pixels per side (images are resized to it); ``widths``: channels
    of the three stride-2 convolutions; ``dim``: embedding size."""

    side: int = 64
    widths: tuple[int, int, int] = (8, 16, 32)
    dim: int = 32
    model_type: str = "krea2-style-encoder"


class StyleEncoder(nn.Module):
    """pixels (batch, 3, side, side) float in [0, 1] → style embeddings (batch, dim), unit
    rows (``forward``); ``embed`` takes uint8 images."""

    def __init__(self, config: StyleEncoderConfig | None = None) -> None:
        super().__init__()
        self.config = config or StyleEncoderConfig()
        layers: list[nn.Module] = []
        c_in = 3
        for c_out in self.config.widths:
            # GroupNorm, not BatchNorm: an embedding must not depend on its batch.
            layers += [nn.Conv2d(c_in, c_out, 3, 2, 1), nn.GroupNorm(4, c_out), nn.GELU()]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(3 * c_in, self.config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x * 2 - 1).flatten(2)  # (batch, channels, positions)
        pooled = torch.cat([f.mean(2), f.std(2), f.amax(2)], dim=1)
        return F.normalize(self.head(pooled), dim=1)

    @torch.inference_mode()
    def embed(self, pixels: np.ndarray | Sequence[np.ndarray], chunk: int = 256) -> np.ndarray:
        """(n, h, w, 3) uint8 RGB images (an array, or a sequence of one size) → (n, dim)
        float32 unit rows; images are area-resized to ``config.side``."""
        if not isinstance(pixels, np.ndarray):
            pixels = np.stack(list(pixels)) if len(pixels) else np.zeros((0, 8, 8, 3), np.uint8)
        if pixels.ndim != 4:
            raise ValueError(f"embed takes (n, h, w, 3) uint8 images, got {_describe(pixels)}")
        if len(pixels):
            check_image(pixels[0], "each image")
        self.eval()
        out = [
            self(to_tensor(pixels[i : i + chunk], self.config.side))
            for i in range(0, len(pixels), chunk)
        ]
        return torch.cat(out).numpy() if out else np.zeros((0, self.config.dim), np.float32)

    def save(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into directory ``path``."""
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, out / WEIGHTS_FILE)
        return out

    @classmethod
    def load(cls, path: str | Path) -> StyleEncoder:
        """The encoder saved in directory ``path`` by ``save``, in eval mode."""
        from safetensors.torch import load_file

        folder = Path(path)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            raise ValueError(f"{folder} holds no style encoder ({CONFIG_FILE} + {WEIGHTS_FILE})")
        raw = json.loads((folder / CONFIG_FILE).read_text())
        if raw.get("model_type") != StyleEncoderConfig.model_type:
            raise ValueError(
                f"{folder}: model_type {raw.get('model_type')!r} is not a style encoder"
            )
        raw["widths"] = tuple(raw["widths"])
        model = cls(StyleEncoderConfig(**raw))
        model.load_state_dict(load_file(folder / WEIGHTS_FILE))
        return model.eval()


def _describe(x: object) -> str:
    return f"{x.dtype} array of shape {x.shape}" if isinstance(x, np.ndarray) else repr(type(x))


def to_tensor(pixels: np.ndarray, side: int) -> torch.Tensor:
    """(n, h, w, 3) uint8 → (n, 3, side, side) float in [0, 1] (area-resized if needed)."""
    if pixels.dtype != np.uint8:
        raise ValueError(f"images must be uint8 RGB, got dtype {pixels.dtype}")
    if pixels.shape[1:3] != (side, side):
        pixels = np.stack(
            [cv2.resize(p, (side, side), interpolation=cv2.INTER_AREA) for p in pixels]
        )
    return torch.from_numpy(np.ascontiguousarray(pixels)).permute(0, 3, 1, 2).float() / 255.0


def style_views(
    rng: np.random.Generator, styles: Sequence[StyleSpec], views: int, size: int
) -> np.ndarray:
    """Each style rendered on ``views`` different random scenes (``sample_scene``) at
    ``size`` px: images (len(styles), views, size, size, 3) uint8."""
    return np.stack(
        [
            np.stack([render(apply_style(sample_scene(rng), s), size, size) for _ in range(views)])
            for s in styles
        ]
    )


def style_twins(rng: np.random.Generator, n: int) -> list[StyleSpec]:
    """``n`` random styles (``sample_style``), each followed by its twin with the other
    object style: 2n styles, so that a batch of twins teaches filled vs outlined."""
    out = []
    for _ in range(n):
        style = sample_style(rng)
        other = "outlined" if style.object_style == "filled" else "filled"
        out += [style, replace(style, object_style=other)]
    return out


def _blur(x: torch.Tensor) -> torch.Tensor:
    """(b, 3, s, s) → the same, half and half mixed with its 3×3 box blur (edges replicated)."""
    box = torch.full((3, 1, 3, 3), 1 / 9)
    return 0.5 * x + 0.5 * F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), box, groups=3)


def _degrade(sharp: torch.Tensor, soft: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Mild sample-like damage on paired (b, 3, s, s) floats in [0, 1] (a view and its
    ``_blur``): half the views blurred, all given grey noise (sigma up to 4 grey levels)."""
    b, _, s, _ = sharp.shape
    pick = torch.rand(b, 1, 1, 1, generator=gen) < 0.5
    x = torch.where(pick, soft, sharp)
    sigma = torch.rand(b, 1, 1, 1, generator=gen) * (4 / 255)
    return (x + sigma * torch.randn((b, 1, s, s), generator=gen)).clamp(0, 1)


def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE of paired unit rows a, b (n, d): row i of a must pick row i of b."""
    logits = a @ b.T / temperature
    target = torch.arange(len(a))
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def train_style_encoder(
    seed: int = 0,
    steps: int = 300,
    size: int = 64,
    *,
    n_styles: int = 128,
    views: int = 3,
    batch: int = 32,
    lr: float = 3e-3,
    temperature: float = 0.1,
    config: StyleEncoderConfig | None = None,
    threads: int = 1,
) -> StyleEncoder:
    """Train a ``StyleEncoder`` (input side ``size``) on ``n_styles`` random styles and
    their twins (``style_twins``), each rendered on ``views`` random scenes at ``size`` px.
    Every step takes ``batch`` styles (``batch // 2`` twin pairs) and two views of each
    (same style, different content) as positives: InfoNCE at ``temperature``, AdamW at
    ``lr`` with a cosine decay, on ``threads`` torch threads (restored after).
    Deterministic for a seed on CPU. Returns the model in eval mode."""
    if steps < 1 or n_styles < 1 or views < 2 or batch < 2:
        raise ValueError(
            f"need steps >= 1, n_styles >= 1, views >= 2, batch >= 2; "
            f"got {steps}, {n_styles}, {views}, {batch}"
        )
    config = config or StyleEncoderConfig(side=size)
    if config.side != size:
        raise ValueError(f"config.side={config.side} differs from the render size {size}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # a tiny model: more threads cost more than they bring
    try:
        torch.manual_seed(seed)
        model = StyleEncoder(config)
        _train(model, seed, steps, n_styles, views, batch // 2, lr, temperature)
    finally:
        torch.set_num_threads(previous)
    return model.eval()


def _train(
    model: StyleEncoder,
    seed: int,
    steps: int,
    n_styles: int,
    views: int,
    pairs: int,
    lr: float,
    temperature: float,
) -> None:
    rng = np.random.default_rng(seed)
    images = style_views(rng, style_twins(rng, n_styles), views, model.config.side)
    flat = to_tensor(images.reshape(-1, *images.shape[2:]), model.config.side)
    pool = flat.reshape(*images.shape[:2], *flat.shape[1:])  # (2·n_styles, views, 3, s, s)
    blurred = _blur(flat).reshape(pool.shape)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    model.train()
    for _ in range(steps):
        twins = torch.randperm(n_styles, generator=gen)[: min(pairs, n_styles)]
        idx = torch.stack([2 * twins, 2 * twins + 1], dim=1).flatten()
        pick = torch.stack([torch.randperm(views, generator=gen)[:2] for _ in idx])
        a = _degrade(pool[idx, pick[:, 0]], blurred[idx, pick[:, 0]], gen)
        b = _degrade(pool[idx, pick[:, 1]], blurred[idx, pick[:, 1]], gen)
        loss = info_nce(model(a), model(b), temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
