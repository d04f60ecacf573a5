"""Patchify/unpatchify latents and build RoPE positions for the joint sequence."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def patchify(latents: Tensor, patch: int) -> Tensor:
    """[B, C, H, W] -> [B, (H/p)(W/p), C*p*p]; feature index c*p*p + ph*p + pw, tokens row-major."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: Tensor, patch: int, h: int, w: int) -> Tensor:
    """Inverse of patchify: [B, N, C*p*p] -> [B, C, H, W] for latent size h x w."""
    b, _, f = tokens.shape
    c = f // (patch * patch)
    x = tokens.view(b, h // patch, w // patch, c, patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def image_positions(
    text_len: int,
    grid_h: int,
    grid_w: int,
    device: torch.device | str | None = None,
    ref_grid: int = 0,
) -> Tensor:
    """RoPE positions [text_len + grid_h*grid_w, 3] float: text rows (0, 0, 0), image (0, i, j).

    ``ref_grid`` > 0 scales the image rows by ref_grid / sqrt(grid_h * grid_w) (position
    interpolation; ``DiTConfig.rope_ref_grid``): an 8x8 grid is unchanged for ref_grid=8, a
    16x16 grid gets positions 0, 0.5, ..., 7.5.
    """
    ii, jj = torch.meshgrid(
        torch.arange(grid_h, device=device), torch.arange(grid_w, device=device), indexing="ij"
    )
    img = torch.stack([torch.zeros_like(ii), ii, jj], dim=-1).reshape(-1, 3)
    txt = torch.zeros(text_len, 3, dtype=img.dtype, device=device)
    pos = torch.cat([txt, img]).float()
    if ref_grid:
        pos[text_len:] *= ref_grid / math.sqrt(grid_h * grid_w)
    return pos
