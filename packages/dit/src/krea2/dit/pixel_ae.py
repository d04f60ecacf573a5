"""PixelAE: the identity 'autoencoder' of toy training, pixels in [-1, 1] as latents."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from krea2.dit.autoencoder import Autoencoder, check_pixels
from krea2.dit.patches import patchify, unpatchify


class PixelAE(nn.Module, Autoencoder):
    """Pixels [B, 3, H, W] in [-1, 1] <-> latents [B, 3*f*f, H/f, W/f] (space-to-depth by f).

    With factor 1 (the toy recipe) latents are the pixels themselves and the DiT's own patch
    (4 on 32x32) does the patchifying. No parameters; decode clamps to [-1, 1].
    """

    def __init__(self, factor: int = 1, channels: int = 3) -> None:
        super().__init__()
        self.factor = factor
        self.channels = channels

    @property
    def latent_channels(self) -> int:
        return self.channels * self.factor * self.factor

    @property
    def spatial_factor(self) -> int:
        return self.factor

    def encode(self, pixels: Tensor, sample: bool = False) -> Tensor:
        check_pixels(pixels, self.channels, self.factor)
        if self.factor == 1:
            return pixels
        b, _, h, w = pixels.shape
        f = self.factor
        tokens = patchify(pixels, f)  # [B, (H/f)(W/f), C f f]
        return tokens.transpose(1, 2).reshape(b, -1, h // f, w // f)

    def decode(self, latents: Tensor) -> Tensor:
        if self.factor == 1:
            return latents.clamp(-1, 1)
        b, c, h, w = latents.shape
        f = self.factor
        tokens = latents.reshape(b, c, h * w).transpose(1, 2)
        return unpatchify(tokens, f, h * f, w * f).clamp(-1, 1)

    def normalize(self, z: Tensor) -> Tensor:
        return z

    def denormalize(self, z: Tensor) -> Tensor:
        return z


def to_uint8(pixels: Tensor) -> Tensor:
    """[-1, 1] float [B, 3, H, W] -> uint8 [B, H, W, 3] (clamp, *0.5 + 0.5, *255, round)."""
    x = (pixels.float().clamp(-1, 1) * 0.5 + 0.5) * 255
    # contiguous: a channels-last view would make numpy reduce the images in another order
    # than a saved copy of them, so a measure of the two would differ in its last bits.
    return x.round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu()
