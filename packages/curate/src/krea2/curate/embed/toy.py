"""The toy image encoder: a small CNN whose embedding keeps a coarse spatial layout.

Stands in for SigLIP-2/DINOv3 where no weights exist (ShapesWorld); trained
self-supervised on the pool by ``krea2.curate.embed.ssl`` and saved as a directory of
``config.json`` + ``model.safetensors``, loaded through the same ``Embedder`` interface
(``load_embedder("toy:PATH")``). Global average pooling would throw away where things are,
and in ShapesWorld a shape's cell is part of what makes two scenes different, so the last
feature map (side/16 × side/16) is flattened instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class ToyEncoderConfig:
    """``side``: input pixels per side (divisible by 16); ``widths``: channels of the four
    stride-2 stages; ``dim``: embedding size; ``threshold``: cosine similarity above which
    two images are copies, set by training (``ssl.calibrate_threshold``)."""

    side: int = 64
    widths: tuple[int, int, int, int] = (16, 32, 64, 128)
    dim: int = 128
    threshold: float = 0.9
    model_type: str = "krea2-toy-encoder"


def _stage(c_in: int, c_out: int, convs: int) -> nn.Sequential:
    # GroupNorm, not BatchNorm: an embedding must not depend on which images share a batch.
    layers: list[nn.Module] = []
    for i in range(convs):
        stride = 2 if i == 0 else 1
        layers += [
            nn.Conv2d(c_in if i == 0 else c_out, c_out, 3, stride, 1),
            nn.GroupNorm(8, c_out),
            nn.GELU(),
        ]
    return nn.Sequential(*layers)


class ToyEncoder(nn.Module):
    """pixels (batch, 3, side, side) float in [0, 1] → features (batch, dim), not normalised."""

    def __init__(self, config: ToyEncoderConfig) -> None:
        super().__init__()
        self.config = config
        w = config.widths
        # One conv in the two high-resolution stages (they cost the most), two after.
        self.stages = nn.Sequential(
            _stage(3, w[0], 1), _stage(w[0], w[1], 1), _stage(w[1], w[2], 2), _stage(w[2], w[3], 2)
        )
        cells = (config.side // 16) ** 2
        self.head = nn.Linear(w[3] * cells, config.dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.stages(pixels * 2.0 - 1.0)
        return self.head(x.flatten(1))


def save_toy_encoder(model: ToyEncoder, path: Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` to directory ``path``."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    # Weights first, then the config, each renamed into place: a directory with a config
    # holds a whole model, so a saver killed midway leaves nothing that loads.
    (path / CONFIG_FILE).unlink(missing_ok=True)
    tmp = path / (WEIGHTS_FILE + ".tmp")
    save_file(state, str(tmp))
    os.replace(tmp, path / WEIGHTS_FILE)
    tmp = path / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(model.config), indent=1))
    os.replace(tmp, path / CONFIG_FILE)
    return path


def load_toy_encoder(path: Path) -> ToyEncoder:
    """The encoder saved in directory ``path`` (callers check the files exist first)."""
    from safetensors.torch import load_file

    raw = json.loads((path / CONFIG_FILE).read_text())
    raw["widths"] = tuple(raw["widths"])
    model = ToyEncoder(ToyEncoderConfig(**raw))
    model.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
    return model.eval()
