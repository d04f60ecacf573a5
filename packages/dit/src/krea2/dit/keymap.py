"""The one place that maps released (Krea) checkpoint keys to diffusers keys and back."""

from __future__ import annotations

import re

from torch import Tensor

from krea2.infra.errors import UserError

# Prefixes that community tools put in front of the released keys.
KNOWN_PREFIXES = ("model.diffusion_model.", "diffusion_model.")

# (original, diffusers) fragments applied inside blocks, in order.
_BLOCK_RENAMES = [
    ("attn.wq.", "attn.to_q."),
    ("attn.wk.", "attn.to_k."),
    ("attn.wv.", "attn.to_v."),
    ("attn.gate.", "attn.to_gate."),
    ("attn.wo.", "attn.to_out.0."),
    ("attn.qknorm.qnorm.scale", "attn.norm_q.weight"),
    ("attn.qknorm.knorm.scale", "attn.norm_k.weight"),
    ("mlp.", "ff."),
    ("prenorm.scale", "norm1.weight"),
    ("postnorm.scale", "norm2.weight"),
]

# Whole-key renames outside the blocks.
_TOP_RENAMES = [
    ("first.", "img_in."),
    ("tmlp.0.", "time_embed.linear_1."),
    ("tmlp.2.", "time_embed.linear_2."),
    ("tproj.1.", "time_mod_proj."),
    ("txtmlp.0.scale", "txt_in.norm.weight"),
    ("txtmlp.1.", "txt_in.linear_1."),
    ("txtmlp.3.", "txt_in.linear_2."),
    ("txtfusion.", "text_fusion."),
    ("last.norm.scale", "final_layer.norm.weight"),
    ("last.linear.", "final_layer.linear."),
    ("last.modulation.lin", "final_layer.scale_shift_table"),
]

_DIFFUSERS_MARKERS = ("img_in.", "transformer_blocks.", "time_embed.", "final_layer.")


def strip_prefix(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop a `diffusion_model.`-style prefix when every key carries it."""
    for p in KNOWN_PREFIXES:
        if sd and all(k.startswith(p) for k in sd):
            return {k[len(p) :]: v for k, v in sd.items()}
    return sd


def detect_format(keys) -> str:
    """'diffusers' or 'krea' from the key names (after strip_prefix)."""
    keys = list(keys)
    if any(k.startswith(_DIFFUSERS_MARKERS) for k in keys):
        return "diffusers"
    if any(k.startswith(("first.", "blocks.", "tmlp.", "last.")) for k in keys):
        return "krea"
    raise UserError(
        f"cannot tell the checkpoint format from its keys (first: {keys[0] if keys else None!r}); "
        "expected Krea keys (first., blocks.N.) or diffusers keys (img_in., transformer_blocks.N.)"
    )


def _rename(key: str, pairs, reverse: bool) -> str | None:
    for a, b in pairs:
        src, dst = (b, a) if reverse else (a, b)
        if key.startswith(src):
            return dst + key[len(src) :]
    return None


def _block_key(rest: str, reverse: bool) -> str:
    for a, b in _BLOCK_RENAMES:
        src, dst = (b, a) if reverse else (a, b)
        if rest.startswith(src):
            return dst + rest[len(src) :]
    return rest


_KREA_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_DIFF_BLOCK = re.compile(r"^transformer_blocks\.(\d+)\.(.+)$")
_FUSION = re.compile(r"^(txtfusion|text_fusion)\.(layerwise_blocks|refiner_blocks)\.(\d+)\.(.+)$")


def krea_to_diffusers(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Released keys -> diffusers keys; `blocks.i.mod.lin` [6D] -> `scale_shift_table` [6, D]."""
    out: dict[str, Tensor] = {}
    for key, v in strip_prefix(sd).items():
        if m := _KREA_BLOCK.match(key):
            i, rest = m.groups()
            if rest == "mod.lin":
                out[f"transformer_blocks.{i}.scale_shift_table"] = v.view(6, -1)
                continue
            out[f"transformer_blocks.{i}.{_block_key(rest, False)}"] = v
        elif m := _FUSION.match(key):
            _, kind, i, rest = m.groups()
            out[f"text_fusion.{kind}.{i}.{_block_key(rest, False)}"] = v
        elif (new := _rename(key, _TOP_RENAMES, False)) is not None:
            out[new] = v
        else:
            raise UserError(f"no diffusers name for checkpoint key {key!r}")
    return out


def diffusers_to_krea(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Diffusers keys -> released keys; `scale_shift_table` [6, D] becomes `mod.lin` [6D]."""
    out: dict[str, Tensor] = {}
    for key, v in strip_prefix(sd).items():
        if m := _DIFF_BLOCK.match(key):
            i, rest = m.groups()
            if rest == "scale_shift_table":
                out[f"blocks.{i}.mod.lin"] = v.reshape(-1)
                continue
            out[f"blocks.{i}.{_block_key(rest, True)}"] = v
        elif m := _FUSION.match(key):
            _, kind, i, rest = m.groups()
            out[f"txtfusion.{kind}.{i}.{_block_key(rest, True)}"] = v
        elif (new := _rename(key, _TOP_RENAMES, True)) is not None:
            out[new] = v
        else:
            raise UserError(f"no Krea name for diffusers key {key!r}")
    return out


def to_krea(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Any supported state dict (either format, optional prefix) -> released keys."""
    sd = strip_prefix(sd)
    return diffusers_to_krea(sd) if detect_format(sd) == "diffusers" else dict(sd)
