"""The one Autoencoder interface every latent space implements (PixelAE, Qwen-Image, FLUX.2)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from krea2.infra.errors import UserError


class Autoencoder(ABC):
    """encode: pixels [B, 3, H, W] in [-1, 1] -> normalized latents [B, C, H/f, W/f];
    decode: normalized latents -> pixels in [-1, 1]. `latent_channels` C and
    `spatial_factor` f describe the latent space; normalize/denormalize map raw AE
    latents to/from the model's normalized space.
    """

    @property
    @abstractmethod
    def latent_channels(self) -> int: ...

    @property
    @abstractmethod
    def spatial_factor(self) -> int: ...

    @abstractmethod
    def encode(self, pixels: Tensor, sample: bool = False) -> Tensor: ...

    @abstractmethod
    def decode(self, latents: Tensor) -> Tensor: ...

    @abstractmethod
    def normalize(self, z: Tensor) -> Tensor: ...

    @abstractmethod
    def denormalize(self, z: Tensor) -> Tensor: ...


def check_pixels(pixels: Tensor, channels: int, factor: int) -> None:
    """Raise UserError unless pixels is [B, channels, H, W] with H, W divisible by factor."""
    if pixels.ndim != 4 or pixels.shape[1] != channels:
        raise UserError(f"pixels must be [B, {channels}, H, W], got {tuple(pixels.shape)}")
    h, w = pixels.shape[-2:]
    if h % factor or w % factor:
        raise UserError(
            f"image size {w}x{h} is not divisible by the autoencoder factor {factor}; "
            f"resize or crop to a multiple of {factor}"
        )
