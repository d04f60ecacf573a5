"""The Qwen-Image VAE and the FLUX.2 VAE behind the Autoencoder interface (diffusers models)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from krea2.dit.autoencoder import Autoencoder, check_pixels
from krea2.dit.patches import patchify, unpatchify
from krea2.infra.errors import UserError


def _vae_folder(path: str | Path) -> Path:
    path = Path(path)
    if (path / "vae" / "config.json").exists():
        return path / "vae"
    if not (path / "config.json").exists():
        raise UserError(f"autoencoder folder {path} has no config.json (nor vae/config.json)")
    return path


def _without_weights(diffusers_cls, path: str | Path) -> nn.Module:
    """The diffusers model of `path`'s config; build under `torch.device("meta")`."""
    return diffusers_cls.from_config(diffusers_cls.load_config(_vae_folder(path)))


class QwenImageVAE(nn.Module, Autoencoder):
    """`AutoencoderKLQwenImage` (Wan-style causal 3D VAE, used with one frame).

    Latents [B, z_dim, H/f, W/f] normalized per channel: (z - latents_mean) / latents_std.
    The release: z_dim 16, f = 8.
    """

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae.eval().requires_grad_(False)
        c = vae.config
        self.register_buffer("mean", torch.tensor(c.latents_mean).view(1, -1, 1, 1), False)
        self.register_buffer("std", torch.tensor(c.latents_std).view(1, -1, 1, 1), False)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> QwenImageVAE:
        """From a local diffusers folder (`Qwen/Qwen-Image` with subfolder `vae`, or the vae)."""
        from diffusers import AutoencoderKLQwenImage

        return cls(AutoencoderKLQwenImage.from_pretrained(_vae_folder(path), torch_dtype=dtype))

    @classmethod
    def config_only(cls, path: str | Path) -> QwenImageVAE:
        """The VAE of `path` without weights (meta device): its latent shape, nothing else."""
        from diffusers import AutoencoderKLQwenImage

        with torch.device("meta"):
            return cls(_without_weights(AutoencoderKLQwenImage, path))

    @classmethod
    def tiny(cls, seed: int = 0) -> QwenImageVAE:
        """Random weights, base_dim 8, z_dim 16, spatial factor 4 (tests)."""
        from diffusers import AutoencoderKLQwenImage

        with torch.random.fork_rng():
            torch.manual_seed(seed)
            vae = AutoencoderKLQwenImage(
                base_dim=8, z_dim=16, dim_mult=[1, 2, 2], num_res_blocks=1,
                temperal_downsample=[False, True],
            )  # fmt: skip
        return cls(vae)

    @property
    def latent_channels(self) -> int:
        return self.vae.config.z_dim

    @property
    def spatial_factor(self) -> int:
        return 2 ** len(self.vae.temperal_downsample)

    def normalize(self, z: Tensor) -> Tensor:
        return (z - self.mean.to(z)) / self.std.to(z)

    def denormalize(self, z: Tensor) -> Tensor:
        return z * self.std.to(z) + self.mean.to(z)

    @torch.no_grad()
    def encode(self, pixels: Tensor, sample: bool = False) -> Tensor:
        """pixels [B, 3, H, W] in [-1, 1] -> normalized latents [B, 16, H/f, W/f] (mode/sample)."""
        check_pixels(pixels, 3, self.spatial_factor)
        dist = self.vae.encode(pixels.to(self.vae.dtype)[:, :, None]).latent_dist
        z = dist.sample() if sample else dist.mode()
        return self.normalize(z[:, :, 0].float())

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """normalized latents [B, 16, h, w] -> pixels [B, 3, h*f, w*f] clamped to [-1, 1]."""
        z = self.denormalize(latents.float()).to(self.vae.dtype)
        return self.vae.decode(z[:, :, None]).sample[:, :, 0].float().clamp(-1, 1)


class Flux2VAE(nn.Module, Autoencoder):
    """`AutoencoderKLFlux2`: latents [B, C, H/f, W/f] (release: C 32, f 8).

    FLUX.2 normalizes 2x2-patchified latents with the VAE's BatchNorm running statistics;
    we apply that normalization in patch space and unpatchify back, so the DiT's own
    patch 2 sees exactly FLUX.2's packed, normalized features (same c*4 + ph*2 + pw order).
    """

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae.eval().requires_grad_(False)
        self.p = int(vae.config.patch_size[0])

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Flux2VAE:
        from diffusers import AutoencoderKLFlux2

        return cls(AutoencoderKLFlux2.from_pretrained(_vae_folder(path), torch_dtype=dtype))

    @classmethod
    def config_only(cls, path: str | Path) -> Flux2VAE:
        """The VAE of `path` without weights (meta device): its latent shape, nothing else."""
        from diffusers import AutoencoderKLFlux2

        with torch.device("meta"):
            return cls(_without_weights(AutoencoderKLFlux2, path))

    @classmethod
    def tiny(cls, seed: int = 0) -> Flux2VAE:
        """Random weights, 2 levels (factor 2), 4 latent channels; BN stats randomised."""
        from diffusers import AutoencoderKLFlux2

        with torch.random.fork_rng():
            torch.manual_seed(seed)
            vae = AutoencoderKLFlux2(
                block_out_channels=(8, 16), layers_per_block=1, latent_channels=4,
                norm_num_groups=4, down_block_types=("DownEncoderBlock2D",) * 2,
                up_block_types=("UpDecoderBlock2D",) * 2,
            )  # fmt: skip
            vae.bn.running_mean.normal_(0, 0.5)
            vae.bn.running_var.uniform_(0.5, 2.0)
        return cls(vae)

    @property
    def latent_channels(self) -> int:
        return self.vae.config.latent_channels

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def _stats(self, z: Tensor) -> tuple[Tensor, Tensor]:
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(z)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1).to(z) + bn.eps)
        return mean, std

    def _in_patch_space(self, z: Tensor, fn) -> Tensor:
        _, _, h, w = z.shape
        if h % self.p or w % self.p:
            raise UserError(f"FLUX.2 latents {h}x{w} must be divisible by its patch {self.p}")
        tok = patchify(z, self.p)  # [B, N, C p p]
        grid = tok.transpose(1, 2).reshape(z.shape[0], -1, h // self.p, w // self.p)
        grid = fn(grid, *self._stats(grid))
        tok = grid.flatten(2).transpose(1, 2)
        return unpatchify(tok, self.p, h, w)

    def normalize(self, z: Tensor) -> Tensor:
        return self._in_patch_space(z, lambda g, m, s: (g - m) / s)

    def denormalize(self, z: Tensor) -> Tensor:
        return self._in_patch_space(z, lambda g, m, s: g * s + m)

    @torch.no_grad()
    def encode(self, pixels: Tensor, sample: bool = False) -> Tensor:
        check_pixels(pixels, 3, self.spatial_factor * self.p)
        dist = self.vae.encode(pixels.to(self.vae.dtype)).latent_dist
        z = dist.sample() if sample else dist.mode()
        return self.normalize(z.float())

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        z = self.denormalize(latents.float()).to(self.vae.dtype)
        return self.vae.decode(z).sample.float().clamp(-1, 1)
