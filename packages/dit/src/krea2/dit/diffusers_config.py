"""DiTConfig <-> diffusers `Krea2Transformer2DModel` config dict."""

from __future__ import annotations

from krea2.dit.config import DiTConfig
from krea2.infra.errors import UserError

DIFFUSERS_CLASS = "Krea2Transformer2DModel"


def to_diffusers_config(cfg: DiTConfig) -> dict:
    """The `config.json` fields of diffusers' Krea2Transformer2DModel for this shape.

    Raises UserError for ablations diffusers cannot express (gate off, partial RoPE,
    time tokens, position interpolation).
    """
    if cfg.rope_ref_grid:
        raise UserError(
            f"config {cfg.name!r} interpolates RoPE positions (rope_ref_grid="
            f"{cfg.rope_ref_grid}), which diffusers' {DIFFUSERS_CLASS} cannot represent; "
            "save it in the krea format instead"
        )
    if not cfg.attn_gate or cfg.timestep_tokens or cfg.rope_dims != cfg.head_dim:
        raise UserError(
            f"config {cfg.name!r} uses an ablation (attn_gate={cfg.attn_gate}, rope_fraction="
            f"{cfg.rope_fraction}, timestep_tokens={cfg.timestep_tokens}) that diffusers' "
            f"{DIFFUSERS_CLASS} cannot represent; save it in the krea format instead"
        )
    return {
        "_class_name": DIFFUSERS_CLASS,
        "in_channels": cfg.in_channels,
        "num_layers": cfg.depth,
        "attention_head_dim": cfg.head_dim,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "intermediate_size": cfg.mlp_hidden_size,
        "timestep_embed_dim": cfg.time_dim,
        "text_hidden_dim": cfg.text_dim,
        "num_text_layers": cfg.text_taps,
        "text_num_attention_heads": cfg.text_heads,
        "text_num_key_value_heads": cfg.text_kv_heads,
        "text_intermediate_size": cfg.text_mlp_hidden_size,
        "num_layerwise_text_blocks": cfg.layerwise_blocks,
        "num_refiner_text_blocks": cfg.refiner_blocks,
        "axes_dims_rope": list(cfg.rope_axes_dims),
        "rope_theta": cfg.rope_theta,
        "norm_eps": cfg.norm_eps,
    }


def from_diffusers_config(d: dict, patch: int = 2, name: str = "custom") -> DiTConfig:
    """DiTConfig from a diffusers config dict; `patch` is a pipeline setting (default 2)."""
    in_ch = int(d.get("in_channels", 64))
    if in_ch % (patch * patch):
        raise UserError(f"diffusers in_channels={in_ch} is not divisible by patch^2={patch**2}")
    hd, heads = int(d.get("attention_head_dim", 128)), int(d.get("num_attention_heads", 48))
    return DiTConfig(
        width=hd * heads,
        depth=int(d.get("num_layers", 28)),
        heads=heads,
        kv_heads=int(d.get("num_key_value_heads", 12)),
        mlp_hidden=int(d.get("intermediate_size", 16384)),
        time_dim=int(d.get("timestep_embed_dim", 256)),
        text_dim=int(d.get("text_hidden_dim", 2560)),
        text_taps=int(d.get("num_text_layers", 12)),
        text_heads=int(d.get("text_num_attention_heads", 20)),
        text_kv_heads=int(d.get("text_num_key_value_heads", 20)),
        text_mlp_hidden=int(d.get("text_intermediate_size", 6912)),
        layerwise_blocks=int(d.get("num_layerwise_text_blocks", 2)),
        refiner_blocks=int(d.get("num_refiner_text_blocks", 2)),
        patch=patch,
        latent_channels=in_ch // (patch * patch),
        rope_theta=float(d.get("rope_theta", 1000.0)),
        rope_axes=[int(a) for a in d.get("axes_dims_rope", (32, 48, 48))],
        norm_eps=float(d.get("norm_eps", 1e-5)),
        name=name,
    )
