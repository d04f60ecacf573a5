"""Helpers for tests and benchmarks: random weights and inputs with padded text."""

from __future__ import annotations

import torch

from krea2.dit.config import DiTConfig


def randomize(module: torch.nn.Module, seed: int = 0, std: float = 0.2) -> None:
    """Fill every parameter with random values (zero-init norms/tables would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def make_inputs(cfg: DiTConfig, batch=2, text_len=7, grid=(3, 5), seed=1, pad=(0, 3)):
    """(img [B,N,C], txt [B,T,taps,dim], t [B], pos [T+N,3], mask [B,T]).

    Row i has pad[i] padded text tokens, placed before two trailing (suffix) tokens.
    """
    from krea2.dit.patches import image_positions

    g = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1]
    img = torch.randn(batch, n, cfg.in_channels, generator=g)
    txt = torch.randn(batch, text_len, cfg.text_taps, cfg.text_dim, generator=g)
    t = torch.rand(batch, generator=g)
    mask = torch.ones(batch, text_len, dtype=torch.bool)
    for i in range(batch):
        k = pad[i % len(pad)]
        if k:
            mask[i, text_len - k - 2 : text_len - 2] = False  # pads sit before the suffix
    pos = image_positions(text_len, *grid)
    return img, txt, t, pos, mask
