"""iREPA: align an early DiT block to spatially normalised patch features of a vision encoder.

REPA with the MLP projector replaced by a 3x3 conv over the token grid and the teacher's
patch tokens z-scored over the spatial axis (iREPA, arXiv 2512.10794). Used for the first
steps of the low-resolution stage only; the projector is never exported with the DiT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class TinyPatchEncoder(nn.Module):
    """A frozen random conv encoder: pixels [B, 3, H, W] -> patch features [B, dim, H/p, W/p].

    Random conv features keep the image's spatial structure (colour and edges per patch),
    which is what iREPA aligns to; used in tests and the toy recipe instead of DINOv3.
    """

    def __init__(self, dim: int, patch: int, seed: int = 0) -> None:
        super().__init__()
        self.dim = dim
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.mix = nn.Conv2d(dim, dim, 3, padding=1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() ** 0.5))
        self.requires_grad_(False)

    @torch.no_grad()
    def forward(self, pixels: Tensor, grid: tuple[int, int]) -> Tensor:
        x = self.mix(F.gelu(self.embed(pixels.float())))
        return F.interpolate(x, size=grid, mode="bilinear", align_corners=False)


class HFPatchEncoder(nn.Module):
    """A frozen transformers vision model (e.g. DINOv3) from a local path; patch tokens on the
    DiT grid. Pixels in [-1, 1] are mapped to the model's ImageNet normalisation."""

    def __init__(self, path: str) -> None:
        super().__init__()
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(path).eval().requires_grad_(False)
        self.dim = int(self.model.config.hidden_size)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    @torch.no_grad()
    def forward(self, pixels: Tensor, grid: tuple[int, int]) -> Tensor:
        x = ((pixels.float() + 1) / 2 - self.mean) / self.std
        tokens = self.model(pixel_values=x).last_hidden_state
        side = round(tokens.shape[1] ** 0.5)
        tokens = tokens[:, -side * side :]  # drop CLS/register tokens
        fmap = tokens.transpose(1, 2).reshape(x.shape[0], -1, side, side)
        return F.interpolate(fmap, size=grid, mode="bilinear", align_corners=False)


def spatial_zscore(feats: Tensor, eps: float = 1e-6) -> Tensor:
    """[B, C, h, w] standardised over the h*w positions of each channel."""
    mean = feats.mean(dim=(2, 3), keepdim=True)
    std = feats.std(dim=(2, 3), keepdim=True)
    return (feats - mean) / (std + eps)


class IrepaHead(nn.Module):
    """Conv projector [B, D, h, w] -> [B, enc_dim, h, w] and the negative-cosine loss."""

    def __init__(self, width: int, enc_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(width, enc_dim, 3, padding=1)

    def forward(self, tokens: Tensor, target: Tensor) -> Tensor:
        """tokens [B, h*w, D] (a block's image tokens, row-major); target [B, enc_dim, h, w].
        Returns the mean over positions of 1 - cos(proj(tokens), zscore(target)) (>= 0)."""
        b, _, h, w = target.shape
        grid = tokens.transpose(1, 2).reshape(b, -1, h, w)
        pred = self.proj(grid.to(self.proj.weight.dtype))
        cos = F.cosine_similarity(pred.float(), spatial_zscore(target.float()), dim=1)
        return (1.0 - cos).mean()


class BlockTap:
    """Keeps the output of one block during forward (a forward hook), for the iREPA loss."""

    def __init__(self, block: nn.Module) -> None:
        self.output: Tensor | None = None
        self._handle = block.register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:
        self.output = output

    def remove(self) -> None:
        self._handle.remove()
        self.output = None


def build_encoder(spec: str, dim: int, patch: int, seed: int) -> nn.Module:
    if spec == "tiny":
        return TinyPatchEncoder(dim, patch, seed)
    return HFPatchEncoder(spec.removeprefix("hf:"))
