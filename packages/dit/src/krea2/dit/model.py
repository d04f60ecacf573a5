"""The Krea 2 single-stream DiT; module names are the released checkpoint's keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from krea2.dit.blocks import LastLayer, SingleStreamBlock
from krea2.dit.checkpointing import run_block
from krea2.dit.config import DiTConfig, get_config
from krea2.dit.layers import RMSNorm, timestep_sinusoid
from krea2.dit.patches import image_positions, patchify, unpatchify
from krea2.dit.rope import rope_angles
from krea2.dit.style_cross import sincos_at
from krea2.dit.textfusion import TextFusion
from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.dit.style_module import StyleTokens


class Krea2DiT(nn.Module):
    """Single-stream flow DiT: predicts the velocity `noise - data` of packed image tokens.

    Checkpoint-key modules: `first` (patch embed), `tmlp` (timestep MLP), `tproj` (shared
    6D modulation), `txtfusion`, `txtmlp` (text projection), `blocks`, `last`.
    With `cfg.timestep_tokens > 0` the ablation replaces `tproj`, every `mod` and
    `last.modulation` by `ttok` (Linear D -> n*D), n time tokens appended to the sequence.
    """

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d = cfg.width
        self.first = nn.Linear(cfg.in_channels, d, bias=True)
        self.tmlp = nn.Sequential(
            nn.Linear(cfg.time_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d)
        )
        if cfg.modulated:
            self.tproj = nn.Sequential(nn.GELU(approximate="tanh"), nn.Linear(d, 6 * d))
        else:
            self.ttok = nn.Linear(d, cfg.timestep_tokens * d)
        self.txtfusion = TextFusion(cfg)
        self.txtmlp = nn.Sequential(
            RMSNorm(cfg.text_dim, cfg.norm_eps),
            nn.Linear(cfg.text_dim, d),
            nn.GELU(approximate="tanh"),
            nn.Linear(d, d),
        )
        self.blocks = nn.ModuleList(
            SingleStreamBlock(
                d,
                cfg.heads,
                cfg.kv_heads,
                cfg.mlp_hidden_size,
                cfg.norm_eps,
                gate=cfg.attn_gate,
                modulated=cfg.modulated,
            )
            for _ in range(cfg.depth)
        )
        self.last = LastLayer(d, cfg.in_channels, cfg.norm_eps, modulated=cfg.modulated)
        # Activation checkpointing per block: None, "full" or "selective" (see checkpointing.py).
        self.checkpointing: str | None = None

    @classmethod
    def from_config(cls, name_or_cfg: str | DiTConfig, **overrides: Any) -> Krea2DiT:
        """Build from a named config (`krea2-12b`, `toy`, ...) or a DiTConfig."""
        cfg = name_or_cfg if isinstance(name_or_cfg, DiTConfig) else get_config(name_or_cfg)
        return cls(cfg.replace(**overrides) if overrides else cfg)

    def init_weights(self) -> None:
        """Re-initialise in place (e.g. after `to_empty`): Linear defaults, zero norms/tables."""
        for m in self.modules():
            if hasattr(m, "reset_parameters") and m is not self:
                m.reset_parameters()

    def forward(
        self,
        img: Tensor,
        txt: Tensor,
        t: Tensor,
        pos: Tensor,
        txt_mask: Tensor | None = None,
        pack_text: bool = False,
        style: StyleTokens | None = None,
    ) -> Tensor:
        """Velocity for packed image tokens.

        img [B, N, in_channels] packed latents (patchify()); txt [B, T, taps, text_dim]
        tapped encoder states; t [B] flow time in [0, 1] (1 = noise); pos [T+N, 3] or
        [B, T+N, 3] RoPE positions (image_positions()); txt_mask bool [B, T] (True = valid
        token) or None for all valid. Returns [B, N, in_channels] in img's dtype.

        pack_text: drop padded text tokens first (valid ones keep their order, rows are
        padded to the batch's longest prompt). Same result up to float rounding, since
        padded tokens are never keys and their outputs are discarded; it costs one host
        sync and gives data-dependent shapes, so it is off by default (use it in eager
        inference or with `torch.compile(dynamic=True)`).

        style: StyleTokens (tokens [B, S, width], bias [B, S]) from a StyleModule, or None
        (the path without references, unchanged). Its S tokens sit between the text and the
        image at RoPE position (0, 0, 0) like text (`pos` stays [T+N, 3]); the key mask
        becomes additive in img's dtype: padded text -inf, style keys their bias (log of
        the strength), image and time keys 0. With `style.cross` (the module's spatial path,
        krea2.dit.style_cross) the image rows also attend to the tokens before each of the
        first len(cross) blocks, through the module's own projections and the code of
        their RoPE (row, column).
        """
        self._check_inputs(img, txt, t, pos, txt_mask, style)
        if pack_text and txt_mask is not None:
            txt, txt_mask, pos = pack_valid_text(txt, txt_mask, pos)
        b, n, _ = img.shape
        tlen = txt.shape[1]
        dtype = img.dtype
        # The timestep is rounded to the model dtype before the sinusoid, like the release.
        temb = self.tmlp(timestep_sinusoid(t.to(dtype), self.cfg.time_dim).to(dtype))

        key_mask = txt_mask_key = None
        if txt_mask is not None:
            txt_mask = txt_mask.bool()
            txt_mask_key = txt_mask[:, None, None, :]
            if style is None:
                extra = n + self.cfg.timestep_tokens
                key_mask = torch.cat([txt_mask, txt_mask.new_ones(b, extra)], dim=1)[:, None, None]

        ctx = self.txtmlp(self.txtfusion(txt.to(dtype), txt_mask_key))
        parts = [ctx, self.first(img)]
        slen = 0  # style tokens between text and image
        if style is not None:
            slen = style.tokens.shape[1]
            parts.insert(1, style.tokens.to(img.device, dtype))
            rest = n + self.cfg.timestep_tokens
            key_mask = style_key_mask(txt_mask, tlen, style.bias.to(img.device), rest, dtype)
            pos = _insert_zero_positions(pos, tlen, slen)
        if self.cfg.modulated:
            tvec = self.tproj(temb)
        else:
            tvec = None
            parts.append(self.ttok(temb).view(b, self.cfg.timestep_tokens, -1))
            pos = _append_zero_positions(pos, self.cfg.timestep_tokens)
        x = torch.cat(parts, dim=1)
        if pos.ndim == 2:
            pos = pos[None]
        rope = None
        if self.cfg.rope_dims:
            rope = rope_angles(pos, self.cfg.rope_axes_dims, self.cfg.rope_theta)

        # Only image rows are read after the blocks, so the last block skips text and style rows.
        last = len(self.blocks) - 1
        cross = None if style is None else style.cross
        if cross is not None:  # the module's decoupled attention, image rows only
            first = tlen + slen  # the first image row
            # in patches, as the reference's tiles are: undo RoPE position interpolation
            grid = self.cfg.rope_ref_grid / n**0.5 if self.cfg.rope_ref_grid else 1.0
            code = sincos_at(pos[0, first : first + n, 1:] / grid, self.cfg.width)
            tokens = style.tokens.to(dtype)
        for i, blk in enumerate(self.blocks):
            start = tlen + slen if i == last else 0
            if cross is not None and i < len(cross):
                rows = x[:, first : first + n]
                rows = rows + cross[i](rows, code, tokens, style.bias)
                x = torch.cat([x[:, :first], rows, x[:, first + n :]], dim=1)
            x = run_block(blk, self.checkpointing, x, tvec, rope, key_mask, start)
        return self.last(x[:, :n], temb if self.cfg.modulated else None)

    def velocity(
        self,
        latents: Tensor,
        txt: Tensor,
        t: Tensor,
        txt_mask: Tensor | None = None,
        pack_text: bool = False,
        style: StyleTokens | None = None,
    ) -> Tensor:
        """Velocity for unpacked latents [B, C, H, W] (H, W divisible by patch) -> [B, C, H, W].

        `style`: StyleTokens for the B rows, or None (see `forward`)."""
        cfg = self.cfg
        if latents.ndim != 4:
            raise UserError(f"latents must be [B, C, H, W], got shape {tuple(latents.shape)}")
        _, c, h, w = latents.shape
        if c != cfg.latent_channels:
            raise UserError(
                f"latents have {c} channels but config {cfg.name!r} expects "
                f"latent_channels={cfg.latent_channels}; use the matching autoencoder"
            )
        if h % cfg.patch or w % cfg.patch:
            raise UserError(
                f"latent size {h}x{w} is not divisible by patch={cfg.patch}; "
                f"choose an image size that is a multiple of patch x autoencoder factor"
            )
        pos = image_positions(
            txt.shape[1], h // cfg.patch, w // cfg.patch, latents.device, cfg.rope_ref_grid
        )
        img = patchify(latents, cfg.patch)
        if style is None:  # the call as before, for wrappers whose forward takes no `style`
            v = self(img, txt, t, pos, txt_mask, pack_text=pack_text)
        else:
            v = self(img, txt, t, pos, txt_mask, pack_text=pack_text, style=style)
        return unpatchify(v, cfg.patch, h, w)

    def _check_inputs(self, img, txt, t, pos, txt_mask, style=None) -> None:
        cfg = self.cfg
        if img.ndim != 3 or img.shape[-1] != cfg.in_channels:
            raise UserError(
                f"img must be [B, N, {cfg.in_channels}] (latent_channels={cfg.latent_channels} x "
                f"patch^2={cfg.patch**2}), got shape {tuple(img.shape)}"
            )
        b, n, _ = img.shape
        if txt.ndim != 4 or txt.shape[0] != b or txt.shape[2:] != (cfg.text_taps, cfg.text_dim):
            raise UserError(
                f"txt must be [B={b}, T, taps={cfg.text_taps}, text_dim={cfg.text_dim}], "
                f"got shape {tuple(txt.shape)}"
            )
        if t.shape != (b,):
            raise UserError(f"t must be [B={b}], got shape {tuple(t.shape)}")
        length = txt.shape[1] + n
        if pos.shape[-2:] != (length, 3) or pos.ndim not in (2, 3):
            raise UserError(
                f"pos must be [T+N={length}, 3] or [B, T+N, 3], got shape {tuple(pos.shape)}"
            )
        if txt_mask is not None and txt_mask.shape != txt.shape[:2]:
            raise UserError(
                f"txt_mask must be [B, T]={tuple(txt.shape[:2])}, got {tuple(txt_mask.shape)}"
            )
        if style is not None:
            s = style.tokens.shape[1] if style.tokens.ndim == 3 else -1
            if style.tokens.shape != (b, s, cfg.width) or style.bias.shape != (b, s):
                raise UserError(
                    f"style tokens must be [B={b}, S, width={cfg.width}] with bias [B, S], got "
                    f"{tuple(style.tokens.shape)} and {tuple(style.bias.shape)}; use a style "
                    f"module made for this DiT (StyleTokens.broadcast for one image's tokens)"
                )
        wdtype = self.first.weight.dtype
        if img.dtype != wdtype and self.first.weight.device.type != "meta":
            raise UserError(
                f"img dtype {img.dtype} differs from the model's {wdtype}; "
                f"cast the input or the model (model.to(dtype))"
            )


def pack_valid_text(txt: Tensor, mask: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Move valid text tokens to the front (stable) and cut T to the longest prompt.

    txt [B, T, taps, C], mask [B, T], pos [T+N, 3] or [B, T+N, 3] -> the same with T' <= T
    (pos becomes [B, T'+N, 3]).
    """
    b, t = mask.shape
    keep = max(int(mask.sum(1).max()), 1)
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :keep]
    txt = txt.gather(1, order[:, :, None, None].expand(-1, -1, *txt.shape[2:]))
    mask = mask.gather(1, order)
    pos = pos.expand(b, *pos.shape[-2:]) if pos.ndim == 2 else pos
    text_pos = pos[:, :t].gather(1, order[:, :, None].expand(-1, -1, pos.shape[-1]))
    return txt, mask, torch.cat([text_pos, pos[:, t:]], dim=1)


def style_key_mask(
    txt_mask: Tensor | None, text_len: int, bias: Tensor, rest: int, dtype: torch.dtype
) -> Tensor:
    """Additive key mask [B, 1, 1, T+S+rest] in `dtype` for the sequence [text, style, rest]:
    padded text -inf (txt_mask bool [B, T], None: all valid), style keys `bias` [B, S], the
    `rest` (image and time) keys 0."""
    b = bias.shape[0]
    zeros = torch.zeros(b, text_len + rest, dtype=dtype, device=bias.device)
    text, others = zeros[:, :text_len], zeros[:, text_len:]
    if txt_mask is not None:
        text = text.masked_fill(~txt_mask, float("-inf"))
    return torch.cat([text, bias.to(dtype), others], dim=1)[:, None, None]


def _insert_zero_positions(pos: Tensor, at: int, n: int) -> Tensor:
    """n rows at RoPE position (0, 0, 0), like text, inserted before row `at` of pos [.., L, 3]."""
    zeros = pos.new_zeros(*pos.shape[:-2], n, 3)
    return torch.cat([pos[..., :at, :], zeros, pos[..., at:, :]], dim=-2)


def _append_zero_positions(pos: Tensor, n: int) -> Tensor:
    """Time tokens sit at RoPE position (0, 0, 0), like text."""
    zeros = pos.new_zeros(*pos.shape[:-2], n, 3)
    return torch.cat([pos, zeros], dim=-2)
