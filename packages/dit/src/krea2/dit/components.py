"""One registry of autoencoders and text encoders by name: parse a spec, describe it, load it.

A spec is `KIND` or `KIND:ARG` (ARG: a local path, or pixel's factor / tiny's seed), e.g.
`pixel`, `pixel:2`, `qwen-image:/models/qwen-image`, `flux2:PATH`, `qwen3-vl:PATH`,
`tiny:0`. Every sampler and trainer names its components this way (docs/architecture.md,
contract 6); a new component is a new entry here, loaders stay lazy (diffusers and
transformers import in seconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from krea2.dit.config import DiTConfig
from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.dit.autoencoder import Autoencoder
    from krea2.dit.text import TextEncoder


@dataclass(frozen=True)
class Kind:
    """One registry entry: how its spec is written and what its ARG is."""

    usage: str  # e.g. "qwen-image:PATH"
    arg: Literal["path", "int"]  # "path": required local path; "int": optional integer


AUTOENCODERS: dict[str, Kind] = {
    "pixel": Kind("pixel[:F]", "int"),  # PixelAE: pixels as latents, space-to-depth by F (1)
    "qwen-image": Kind("qwen-image:PATH", "path"),  # Qwen-Image VAE, a diffusers folder
    "flux2": Kind("flux2:PATH", "path"),  # FLUX.2 VAE, a diffusers folder
}
TEXT_ENCODERS: dict[str, Kind] = {
    "qwen3-vl": Kind("qwen3-vl:PATH", "path"),  # frozen Qwen3-VL from a local folder
    "tiny": Kind("tiny[:SEED]", "int"),  # random tiny Qwen3-VL at the DiT's text shape
}
RENAMED = {"qwen": "qwen-image"}  # old spelling -> registry name


@dataclass(frozen=True)
class ComponentSpec:
    """A parsed spec: `kind` (a registry name) and its argument, a local `path` or a
    `number` (pixel's factor, tiny's seed; None: the default)."""

    kind: str
    path: Path | None = None
    number: int | None = None

    def __str__(self) -> str:
        arg = self.path if self.path is not None else self.number
        return self.kind if arg is None else f"{self.kind}:{arg}"


def _parse(spec: str | ComponentSpec, table: dict[str, Kind], what: str, also=()) -> ComponentSpec:
    if isinstance(spec, ComponentSpec):
        return spec
    kind, _, arg = spec.partition(":")
    if kind in RENAMED:
        new = RENAMED[kind]
        raise UserError(f"{what} {spec!r}: {kind!r} is now named {new!r}; write '{new}:{arg}'")
    if kind not in table:
        names = ", ".join([*also, *(k.usage for k in table.values())])
        hint = " (a local folder is written KIND:PATH)" if "/" in spec else ""
        raise UserError(f"{what} {spec!r} is not a known name{hint}; use one of: {names}")
    entry = table[kind]
    if entry.arg == "path" and not arg:
        raise UserError(f"{what} {spec!r} needs a local path: write '{entry.usage}'")
    if entry.arg == "path":
        return ComponentSpec(kind, path=Path(arg))
    if arg and not arg.isdigit():
        raise UserError(f"{what} {spec!r}: {arg!r} is not a whole number; write '{entry.usage}'")
    return ComponentSpec(kind, number=int(arg) if arg else None)


def parse_autoencoder(spec: str | ComponentSpec) -> ComponentSpec:
    """Check an autoencoder spec (no I/O); UserError names the bad spec and the valid ones."""
    return _parse(spec, AUTOENCODERS, "autoencoder")


def parse_text_encoder(spec: str | ComponentSpec, also: Sequence[str] = ()) -> ComponentSpec:
    """Check a text-encoder spec (no I/O). `also`: names the caller handles itself (e.g. the
    trainer's learned `words` table), listed as valid in the error."""
    return _parse(spec, TEXT_ENCODERS, "text encoder", also)


def _vae_class(kind: str):
    from krea2.dit.vae import Flux2VAE, QwenImageVAE

    return {"qwen-image": QwenImageVAE, "flux2": Flux2VAE}[kind]


@dataclass(frozen=True)
class LatentSpace:
    """What an autoencoder makes of pixels [B, 3, H, W]: latents [B, channels, H/f, W/f]."""

    channels: int
    factor: int  # f, pixels per latent along each side


def latent_space(spec: str | ComponentSpec) -> LatentSpace:
    """The latent shape of `spec` without loading weights (a VAE's config is read on the
    meta device; its folder must exist)."""
    from krea2.dit.pixel_ae import PixelAE

    s = parse_autoencoder(spec)
    ae = PixelAE(s.number or 1) if s.kind == "pixel" else _vae_class(s.kind).config_only(s.path)
    return LatentSpace(ae.latent_channels, ae.spatial_factor)


def load_autoencoder(
    spec: str | ComponentSpec,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> Autoencoder:
    """The autoencoder of `spec` on `device`, frozen; VAE weights in `dtype` (PixelAE has none)."""
    from krea2.dit.pixel_ae import PixelAE

    s = parse_autoencoder(spec)
    if s.kind == "pixel":
        ae = PixelAE(s.number or 1)
    else:
        ae = _vae_class(s.kind).from_pretrained(s.path, dtype=dtype)
    return ae.to(device).eval().requires_grad_(False)


def load_text_encoder(
    spec: str | ComponentSpec,
    dit: DiTConfig,
    max_length: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    corpus: Sequence[str] = (),
) -> TextEncoder:
    """The frozen text encoder of `spec`, giving T = `max_length` tokens in `dit`'s text
    shape (text_taps x text_dim; UserError otherwise). `tiny` is float32, its tokenizer
    trained on the prompt template plus `corpus` (the caller's vocabulary)."""
    from krea2.dit.text import TextEncoder

    s = parse_text_encoder(spec)
    if s.kind == "tiny":
        enc = TextEncoder.tiny(
            dit.text_dim, dit.text_taps, max_length, seed=s.number or 0, corpus=corpus
        )
        return enc.to(device)
    check_text_shape(s, text_shape(s, dit), dit)  # from its config, before the weights load
    return TextEncoder.from_pretrained(s.path, max_length=max_length, dtype=dtype, device=device)


@dataclass(frozen=True)
class TextShape:
    """What a text encoder gives the DiT per token: `taps` stacked layers of `dim` features."""

    taps: int
    dim: int


def text_shape(spec: str | ComponentSpec, dit: DiTConfig) -> TextShape:
    """The per-token shape of text encoder `spec`, read from its `config.json` (no weights):
    Qwen3-VL's hidden size at the release's taps. `tiny` is built at `dit`'s shape.
    UserError when the folder has no config or too few layers for the release's taps."""
    import json

    from krea2.dit.text import RELEASE_TAPS, text_encoder_folder

    s = parse_text_encoder(spec)
    if s.kind == "tiny":
        return TextShape(dit.text_taps, dit.text_dim)
    conf_path = text_encoder_folder(s.path) / "config.json"
    try:
        text = json.loads(conf_path.read_text()).get("text_config") or {}
        dim, layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"text encoder {s}: {conf_path} is not a Qwen3-VL config ({e!r}); give the "
            "folder of a Qwen3-VL model"
        ) from None
    if max(RELEASE_TAPS) > layers:
        raise UserError(
            f"text encoder {s} has {layers} layers; the DiT's text taps read hidden states "
            f"{RELEASE_TAPS[0]}..{max(RELEASE_TAPS)}, so give a Qwen3-VL with at least "
            f"{max(RELEASE_TAPS)} layers (Qwen3-VL-4B has 36)"
        )
    return TextShape(len(RELEASE_TAPS), dim)


def check_text_shape(spec: str | ComponentSpec, shape: TextShape, dit: DiTConfig) -> None:
    """UserError unless the encoder's `shape` is the DiT's text_taps x text_dim."""
    if (shape.taps, shape.dim) != (dit.text_taps, dit.text_dim):
        raise UserError(
            f"text encoder {spec} gives {shape.taps} taps x {shape.dim} features per token, "
            f"but the DiT {dit.name!r} has text_taps={dit.text_taps}, text_dim={dit.text_dim}; "
            f"use the text encoder the DiT was trained with, or a DiT with text_taps="
            f"{shape.taps}, text_dim={shape.dim}"
        )
