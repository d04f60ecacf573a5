"""The style-reference module: reference latents -> a few style tokens per reference for the DiT.

Design (docs/dit.md, "Style reference"; docs/architecture.md, contract 9): each reference is
patchified like the image, embedded to the DiT's width with a 2-D sin-cos position code,
pooled by M learned queries into M tokens, RMS-normalised and given the embedding of its
slot (its place in the list). The tokens enter the DiT's single stream between text and
image; a reference's strength s becomes the additive bias log(s) on its keys' attention
logits, so s = 0 removes it exactly and s scales its share of attention. The module is
separate weights (safetensors, config in the metadata) trained on a frozen base.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from krea2.dit.config import DiTConfig
from krea2.dit.layers import RMSNorm, SwiGLU
from krea2.dit.patches import patchify
from krea2.dit.style_cross import STYLE_POOLS, StyleCross, cross_params, sincos_at, tile_pool
from krea2.infra.errors import UserError

STYLE_CONFIG_KEY = "krea2.dit.style_config"  # safetensors metadata entry: StyleConfig as JSON
MATCHED_FIELDS = ("width", "latent_channels", "patch")  # what must equal the DiT's


@dataclass(frozen=True)
class StyleConfig:
    """Shape of a style module; `for_dit` takes width, latent channels and patch from a DiT."""

    width: int  # the DiT's width D
    latent_channels: int  # the autoencoder's latent channels C
    patch: int  # reference latents are patchified at this patch (the DiT's)
    tokens: int = 4  # pooled tokens per reference (M)
    max_refs: int = 4  # slot embeddings: at most this many references at once
    heads: int = 4  # heads of the attention pooling (and of the decoupled attention)
    pool: str = "attention"  # "attention": M learned queries; "tiles": a sqrt(M)^2 grid's means
    cross: int = 0  # the first `cross` blocks' image rows attend to the tokens (style_cross)
    model: str = ""  # the DiT config name it was made for (for messages)

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def for_dit(cls, dit_cfg: DiTConfig, **overrides: Any) -> StyleConfig:
        """The config matching `dit_cfg` (width, latent_channels, patch, name), with
        `overrides` (tokens, max_refs, heads, ...) changed."""
        base: dict[str, Any] = {
            "width": dit_cfg.width,
            "latent_channels": dit_cfg.latent_channels,
            "patch": dit_cfg.patch,
            "model": dit_cfg.name,
        }
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise UserError(f"StyleConfig has no field {sorted(unknown)[0]!r}")
        return cls(**(base | overrides))

    def validate(self) -> None:
        """UserError naming the first bad field."""
        for name in ("width", "latent_channels", "patch", "tokens", "max_refs", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"StyleConfig {name}={value!r} must be a positive whole number")
        if self.width % self.heads:
            raise UserError(
                f"StyleConfig width={self.width} is not divisible by heads={self.heads}"
            )
        if not isinstance(self.cross, int) or isinstance(self.cross, bool) or self.cross < 0:
            raise UserError(f"StyleConfig cross={self.cross!r} must be a whole number >= 0")
        if self.pool not in STYLE_POOLS:
            raise UserError(f"StyleConfig pool={self.pool!r} must be one of {list(STYLE_POOLS)}")
        if self.pool == "tiles" and math.isqrt(self.tokens) ** 2 != self.tokens:
            raise UserError(
                f"StyleConfig tokens={self.tokens} must be a square (4, 9, 16, ...) with "
                "pool='tiles': the tokens are a g x g grid of tiles"
            )
        if self.width % 4:  # the 2-D sin-cos code gives each axis a sin and a cos half
            raise UserError(f"StyleConfig width={self.width} must be a multiple of 4")

    def check_matches(self, dit_cfg: DiTConfig, where: str = "the style module") -> None:
        """UserError (one line, both values) unless this module was made for `dit_cfg`'s shape
        and its spatial path has no more layers than the DiT has blocks (one would never run)."""
        bad = [f for f in MATCHED_FIELDS if getattr(self, f) != getattr(dit_cfg, f)]
        made = f" (made for {self.model!r})" if self.model else ""
        if bad:
            mine = ", ".join(f"{f} {getattr(self, f)}" for f in bad)
            theirs = ", ".join(f"{f} {getattr(dit_cfg, f)}" for f in bad)
            raise UserError(
                f"{where}{made} has {mine} but the DiT {dit_cfg.name!r} has {theirs}; "
                "use the style module trained for this DiT"
            )
        if self.cross > dit_cfg.depth:
            raise UserError(
                f"{where}{made} has cross {self.cross} but the DiT {dit_cfg.name!r} has only "
                f"{dit_cfg.depth} blocks"
            )


class StyleTokens(NamedTuple):
    """What the DiT takes: style tokens and the attention bias on their keys."""

    tokens: Tensor  # [B, S, D] style tokens in the DiT's width (S = R * M)
    bias: Tensor  # [B, S] float32 additive bias on the attention logits (log s; -inf = off)
    # the module's decoupled attention, one StyleCross per block from the first, or None
    cross: nn.ModuleList | None = None

    def to(self, device: torch.device | str, dtype: torch.dtype) -> StyleTokens:
        """The tokens in `dtype` on `device` (the bias stays float32)."""
        return StyleTokens(self.tokens.to(device, dtype), self.bias.to(device), self.cross)

    def broadcast(self, batch: int) -> StyleTokens:
        """Tokens of one image ([1, S, D]) repeated as a view for `batch` images."""
        if self.tokens.shape[0] != 1:
            raise UserError(
                f"style tokens are for one image ([1, S, D]) to broadcast, got "
                f"{tuple(self.tokens.shape)}"
            )
        tokens, bias = self.tokens.expand(batch, -1, -1), self.bias.expand(batch, -1)
        return StyleTokens(tokens, bias, self.cross)


class StyleModule(nn.Module):
    """Reference latents [B, R, C, h, w] and strengths [B, R] -> StyleTokens (or None).

    Parameters: `embed` (Linear C p^2 -> D), `mlp_norm` + `mlp` (SwiGLU D -> D -> D, a
    residual per patch, so pooled features are not linear in the latents), `kv_norm`,
    `wk`/`wv`/`wo` and `queries` [M, D] (the attention pooling; none with pool="tiles"),
    `norm` (RMSNorm of the pooled tokens), `slots` [max_refs, D] and `cross` (cfg.cross
    StyleCross layers, the DiT calls them; None without).
    """

    def __init__(self, cfg: StyleConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d = cfg.width
        self.embed = nn.Linear(cfg.latent_channels * cfg.patch**2, d)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, d)
        if cfg.pool == "attention":
            self.kv_norm = RMSNorm(d)
            self.wk = nn.Linear(d, d, bias=False)
            self.wv = nn.Linear(d, d, bias=False)
            self.wo = nn.Linear(d, d, bias=False)
            self.queries = nn.Parameter(torch.empty(cfg.tokens, d))
        self.norm = RMSNorm(d)
        self.slots = nn.Parameter(torch.empty(cfg.max_refs, d))
        self.cross = (
            nn.ModuleList(StyleCross(d, cfg.heads) for _ in range(cfg.cross)) if cfg.cross else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Small random queries and slots: near mean pooling at first, slots distinct."""
        if self.cfg.pool == "attention":
            nn.init.normal_(self.queries, std=0.02)
        nn.init.normal_(self.slots, std=0.02)

    def init_weights(self) -> None:
        """Re-initialise every parameter in place (e.g. after `to_empty` from meta)."""
        for m in self.modules():
            reset = getattr(m, "reset_parameters", None)
            if callable(reset):
                reset()

    def forward(
        self, refs: Tensor, strengths: Tensor, keep_all: bool = False
    ) -> StyleTokens | None:
        """refs [B, R, C, h, w] reference latents (h, w divisible by patch; R <= max_refs);
        strengths [B, R] float >= 0 (1 = as trained, 0 = absent).

        Reference r gets tokens [r*M, (r+1)*M) with slot embedding r (its place in the list)
        and bias log(strength[:, r]). References whose strength is 0 in every row are
        dropped (the others keep their slots); when all are, returns None, so the DiT runs
        its exact no-reference path. One host sync (which references are kept).

        keep_all: drop nothing and never return None (strength 0 is then a -inf bias, the
        same output up to float rounding). For training under FSDP or DDP: every parameter
        gets a gradient (zero for absent references) on every rank, so the gradient
        reduction runs on all ranks even when one rank's rows all have strength 0.
        """
        self._check_inputs(refs, strengths)
        if keep_all:
            keep = torch.arange(refs.shape[1], device=refs.device)
        else:
            keep = (strengths > 0).any(dim=0).nonzero().flatten()
        if keep.numel() == 0:
            return None
        if keep.numel() < refs.shape[1]:
            refs, strengths = refs[:, keep], strengths[:, keep]
        b, r, _, h, w = refs.shape
        p, m = self.cfg.patch, self.cfg.tokens
        x = self.embed(patchify(refs.flatten(0, 1).to(self.embed.weight.dtype), p))
        x = x + sincos_2d(h // p, w // p, self.cfg.width, x.device).to(x.dtype)
        x = x + self.mlp(self.mlp_norm(x))  # [B R, n, D]
        tiles = self.cfg.pool == "tiles"
        pooled = tile_pool(x, h // p, w // p, m) if tiles else self._pool(x)  # [B R, M, D]
        tokens = self.norm(pooled).unflatten(0, (b, r)) + self.slots[keep][None, :, None]
        bias = torch.log(strengths.float()).repeat_interleave(m, dim=1)
        return StyleTokens(tokens.flatten(1, 2), bias, self.cross)

    def _pool(self, x: Tensor) -> Tensor:
        """Attention pooling: M learned queries over the patch tokens x [B', n, D] -> [B', M, D]."""
        hd = self.cfg.width // self.cfg.heads
        kv = self.kv_norm(x)
        k = self.wk(kv).unflatten(-1, (-1, hd)).transpose(1, 2)  # [B', H, n, hd]
        v = self.wv(kv).unflatten(-1, (-1, hd)).transpose(1, 2)
        q = self.queries.to(x.dtype).unflatten(-1, (-1, hd)).transpose(0, 1)  # [H, M, hd]
        q = q.expand(x.shape[0], *q.shape)
        out = F.scaled_dot_product_attention(q, k, v)  # [B', H, M, hd]
        return self.wo(out.transpose(1, 2).flatten(2))

    def _check_inputs(self, refs: Tensor, strengths: Tensor) -> None:
        cfg = self.cfg
        if refs.ndim != 5 or refs.shape[2] != cfg.latent_channels:
            raise UserError(
                f"style references must be latents [B, R, C={cfg.latent_channels}, h, w], got "
                f"{tuple(refs.shape)}"
            )
        b, r, _, h, w = refs.shape
        if h % cfg.patch or w % cfg.patch:
            raise UserError(
                f"style reference latents {h}x{w} are not divisible by patch={cfg.patch}; "
                "encode references at the sampling size"
            )
        if r > cfg.max_refs:
            raise UserError(
                f"{r} style references, but the style module has {cfg.max_refs} slots; "
                f"give at most {cfg.max_refs}"
            )
        if strengths.shape != (b, r):
            raise UserError(f"style strengths must be [B={b}, R={r}], got {tuple(strengths.shape)}")
        if not bool(torch.isfinite(strengths).all()) or bool((strengths < 0).any()):
            raise UserError(f"style strengths must be finite and >= 0, got {strengths.tolist()}")


def sincos_2d(grid_h: int, grid_w: int, dim: int, device: torch.device | str) -> Tensor:
    """Fixed 2-D position code [grid_h * grid_w, dim] float32, tokens row-major: the
    `style_cross.sincos_at` code of every patch's (row, column). Fixed, so any reference
    size works; the layout is there for the module to use or ignore."""
    ii, jj = torch.meshgrid(
        torch.arange(grid_h, device=device), torch.arange(grid_w, device=device), indexing="ij"
    )
    return sincos_at(torch.stack([ii, jj], dim=-1).reshape(-1, 2), dim)


def style_module_params(cfg: StyleConfig) -> int:
    """Exact parameter count of StyleModule(cfg), without building it."""
    d = cfg.width
    embed = cfg.latent_channels * cfg.patch**2 * d + d
    mlp = d + 3 * d * d  # mlp_norm + SwiGLU(D, D)
    pool = d + 3 * d * d + cfg.tokens * d if cfg.pool == "attention" else 0  # kv_norm, wk, ..
    cross = cross_params(d, cfg.cross)
    return embed + mlp + pool + cross + d + cfg.max_refs * d  # + norm, slots


def style_module_flops(cfg: StyleConfig, ref_tokens: int, refs: int = 1) -> int:
    """FLOPs of one forward over `refs` references of `ref_tokens` patch tokens each (matmuls
    and attention, as torch's FlopCounterMode counts). Once per image: not per step."""
    d, m, c = cfg.width, cfg.tokens, cfg.latent_channels * cfg.patch**2
    per_token = 2 * c * d + 2 * 3 * d * d  # embed, SwiGLU
    if cfg.pool == "tiles":  # means: no matmul
        return refs * ref_tokens * per_token
    per_token += 2 * 2 * d * d  # k and v
    pooling = 4 * m * ref_tokens * d + 2 * m * d * d  # QK^T and PV for M queries, wo
    return refs * (ref_tokens * per_token + pooling)


def save_style_module(module: StyleModule, path: str | Path) -> Path:
    """Write `module` as one .safetensors (its StyleConfig as JSON in the metadata),
    atomically (a temporary file renamed). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    meta = {STYLE_CONFIG_KEY: json.dumps(dataclasses.asdict(module.cfg)), "format": "pt"}
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(sd, str(tmp), metadata=meta)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_style_config(path: str | Path) -> StyleConfig:
    """The StyleConfig of a saved module from its header, no tensor read; UserError
    (one line) when the file is missing, unreadable or not a style module."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"style module {path} does not exist (give a .safetensors file)")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
    except (OSError, SafetensorError) as e:
        raise UserError(f"cannot read style module {path}: {_one_line(e)}") from None
    if STYLE_CONFIG_KEY not in meta:
        raise UserError(
            f"{path} is not a style module (no {STYLE_CONFIG_KEY!r} metadata); give a file "
            "written by save_style_module"
        )
    try:
        fields = json.loads(meta[STYLE_CONFIG_KEY])
        return StyleConfig(**fields)
    except (json.JSONDecodeError, TypeError, UserError) as e:
        why = _one_line(e)
        raise UserError(f"style module {path}: bad {STYLE_CONFIG_KEY} ({why})") from None


def load_style_module(
    path: str | Path,
    dit_cfg: DiTConfig | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> StyleModule:
    """The module saved at `path` on `device` (in `dtype`, else the file's), in eval mode.

    UserError (one line) when it is unreadable, not a style module, its
    tensors do not fit its config, or (given `dit_cfg`) it was made for a DiT of another
    width, latent_channels or patch (both values named).
    """
    path = Path(path)
    cfg = read_style_config(path)
    if dit_cfg is not None:
        cfg.check_matches(dit_cfg, f"style module {path}")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            sd = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except (OSError, SafetensorError) as e:
        raise UserError(f"cannot read style module {path}: {_one_line(e)}") from None
    with torch.device("meta"):
        module = StyleModule(cfg)
    want = module.state_dict()
    for k, ref in want.items():
        if k not in sd or tuple(sd[k].shape) != tuple(ref.shape):
            got = "missing" if k not in sd else f"shape {tuple(sd[k].shape)}"
            raise UserError(
                f"style module {path}: tensor {k!r} is {got}, its config wants "
                f"{tuple(ref.shape)}; the file is damaged or not written by save_style_module"
            )
    extra = sorted(set(sd) - set(want))
    if extra:
        raise UserError(f"style module {path}: unexpected tensor {extra[0]!r}")
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    module.load_state_dict(sd, strict=True, assign=True)
    return module.eval()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
