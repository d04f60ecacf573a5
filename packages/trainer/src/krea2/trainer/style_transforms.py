"""What a style-reference stage shows its module as the reference of a training image.

The module learns to take from the reference whatever helps predict the target, so the
reference decides what leaks: the target itself (``reconstruct``) teaches it to copy the
content; a transform that keeps the style and destroys the content (``shuffle``,
``inpaint_shuffle``) teaches it style alone; another image of the same style (``paired``,
from the shard's ``reference`` column) is the upper bound. All transforms are label-free
image operations on uint8 pixels and draw their randomness from one generator per sample,
so 2 ranks make what 1 rank makes and a resume remakes the same references.
"""

from __future__ import annotations

import enum

import torch
import torch.nn.functional as F
from torch import Tensor

from krea2.infra.errors import UserError


class ReferenceMode(enum.StrEnum):
    RECONSTRUCT = "reconstruct"  # the target, re-cropped: the leakage baseline
    SHUFFLE = "shuffle"  # the target's tiles shuffled, flipped and rotated
    INPAINT_SHUFFLE = "inpaint_shuffle"  # salient pixels painted over, then shuffled
    PAIRED = "paired"  # the row's own reference image (same style, other content)


def reconstruct_reference(pixels: Tensor, gen: torch.Generator) -> Tensor:
    """pixels uint8 [3, H, W] -> the same image cropped to 85-100 % of each side at a
    random place, resized back to [3, H, W] (bilinear): IP-Adapter's training signal, the
    target itself, so copying its content pays."""
    _, h, w = pixels.shape
    out = pixels
    share = 0.85 + 0.15 * float(torch.rand((), generator=gen))
    ch, cw = max(1, round(h * share)), max(1, round(w * share))
    top = int(torch.randint(0, h - ch + 1, (), generator=gen))
    left = int(torch.randint(0, w - cw + 1, (), generator=gen))
    crop = out[:, top : top + ch, left : left + cw].float()[None]
    return (
        F.interpolate(crop, size=(h, w), mode="bilinear", align_corners=False)[0]
        .round()
        .clamp(0, 255)
        .to(torch.uint8)
    )


def shuffle_tiles(pixels: Tensor, tiles: int, gen: torch.Generator) -> Tensor:
    """pixels uint8 [3, H, W] cut into a ``tiles`` x ``tiles`` grid (H, W divisible by it),
    the tiles permuted and each mirrored and rotated by a multiple of 90° at random.

    What survives is what a tile shows locally: colours, texture, stroke width; the layout
    (where things are, how many, which shape a whole object makes) does not."""
    c, h, w = pixels.shape
    if h % tiles or w % tiles or h // tiles != w // tiles:
        raise UserError(f"a {h}x{w} image does not cut into {tiles}x{tiles} square tiles")
    s = h // tiles
    grid = pixels.unfold(1, s, s).unfold(2, s, s)  # [3, tiles, tiles, s, s]
    flat = grid.reshape(c, tiles * tiles, s, s)
    order = torch.randperm(tiles * tiles, generator=gen)
    turns = torch.randint(0, 4, (tiles * tiles,), generator=gen).tolist()
    flips = (torch.rand(tiles * tiles, generator=gen) < 0.5).tolist()
    out = []
    for k, i in enumerate(order.tolist()):
        tile = flat[:, i]
        tile = tile.flip(-1) if flips[k] else tile
        out.append(torch.rot90(tile, turns[k], dims=(-2, -1)))
    rows = torch.stack(out).view(tiles, tiles, c, s, s)
    return rows.permute(2, 0, 3, 1, 4).reshape(c, h, w).contiguous()


def inpaint_salient(pixels: Tensor, threshold: float = 48.0, grid: int = 12) -> Tensor:
    """pixels uint8 [3, H, W] or [B, 3, H, W] with every pixel far (RGB distance >
    ``threshold``) from a smooth background estimate replaced by that estimate.

    The estimate is a per-channel median over a window of ~60 % of the shorter side (every
    object that covers less than half of such a window disappears from it), repeated at
    half the window to follow gradients, computed on a copy area-averaged down to about
    ``grid`` px and upsampled bilinearly (a background is smooth; the cost no longer grows
    with the image). No labels are used. Small texture survives the threshold, objects
    (saturated, far from the background) do not."""
    x = pixels.float() if pixels.ndim == 4 else pixels.float()[None]
    h, w = x.shape[-2:]
    f = max(1, min(h, w) // grid)
    background = F.avg_pool2d(x, f, ceil_mode=True) if f > 1 else x
    side = min(background.shape[-2:])
    for share in (0.6, 0.3):
        k = max(3, int(side * share) | 1)  # odd window
        pad = k // 2
        padded = F.pad(background, (pad, pad, pad, pad), mode="replicate")
        patches = padded.unfold(2, k, 1).unfold(3, k, 1)  # [B, 3, h', w', k, k]
        background = patches.flatten(-2).median(dim=-1).values
    if background.shape[-2:] != (h, w):
        background = F.interpolate(background, size=(h, w), mode="bilinear", align_corners=False)
    distance = (x - background).square().sum(1, keepdim=True).sqrt()
    out = torch.where(distance > threshold, background, x).round().clamp(0, 255)
    return out.to(torch.uint8) if pixels.ndim == 4 else out[0].to(torch.uint8)


def style_references(
    pixels: Tensor,
    mode: ReferenceMode,
    gens: list[torch.Generator],
    tiles: int = 4,
    paired: Tensor | None = None,
) -> Tensor:
    """The reference of each training image: pixels uint8 [B, 3, H, W] -> uint8
    [B, 3, H, W], sample j drawn from ``gens[j]``. ``paired`` (uint8 [B, 3, H, W]) is the
    shard's reference column, required by ``paired`` mode."""
    if mode is ReferenceMode.PAIRED:
        if paired is None:
            raise UserError(
                "reference mode 'paired' needs shards with a 'reference' column (image bytes)"
            )
        return paired
    if mode is ReferenceMode.INPAINT_SHUFFLE:
        pixels = inpaint_salient(pixels)  # the whole batch at once
    out = []
    for img, gen in zip(pixels, gens, strict=True):
        if mode is ReferenceMode.RECONSTRUCT:
            out.append(reconstruct_reference(img, gen))
        else:
            out.append(shuffle_tiles(img, tiles, gen))
    return torch.stack(out)


__all__ = [
    "ReferenceMode",
    "inpaint_salient",
    "reconstruct_reference",
    "shuffle_tiles",
    "style_references",
]
