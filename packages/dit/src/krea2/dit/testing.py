"""Helpers for tests, benchmarks and docs: random weights, inputs with padded text, and a
tiny whole-model folder in the release layout."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from krea2.dit.config import DiTConfig


def randomize(module: torch.nn.Module, seed: int = 0, std: float = 0.2) -> None:
    """Fill every parameter with random values (zero-init norms/tables would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _attn_flops(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """SDPA forward FLOPs from the shapes FlopCounterMode passes (q, k, v: [B, H, L, hd])."""
    b, h, sq, d = q
    return 4 * b * h * sq * k[2] * d


def _attn_bwd_flops(*args: Any, **kwargs: Any) -> int:
    """SDPA backward FLOPs: twice the forward's."""
    q, k = args[1], args[2]  # args[0] is grad_out
    b, h, sq, d = q
    return 8 * b * h * sq * k[2] * d


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs torch's FlopCounterMode counts while `fn()` runs; it does not know the CPU
    flash-attention kernel, which is counted here like any SDPA."""
    from torch.utils.flop_counter import FlopCounterMode

    cpu_sdpa = {
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attn_flops,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _attn_bwd_flops,
    }
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as fc:
        fn()
    return fc.get_total_flops()


def make_inputs(cfg: DiTConfig, batch=2, text_len=7, grid=(3, 5), seed=1, pad=(0, 3)):
    """(img [B,N,C], txt [B,T,taps,dim], t [B], pos [T+N,3], mask [B,T]).

    Row i has pad[i] padded text tokens, placed before two trailing (suffix) tokens.
    """
    from krea2.dit.patches import image_positions

    g = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1]
    img = torch.randn(batch, n, cfg.in_channels, generator=g)
    txt = torch.randn(batch, text_len, cfg.text_taps, cfg.text_dim, generator=g)
    t = torch.rand(batch, generator=g)
    mask = torch.ones(batch, text_len, dtype=torch.bool)
    for i in range(batch):
        k = pad[i % len(pad)]
        if k:
            mask[i, text_len - k - 2 : text_len - 2] = False  # pads sit before the suffix
    pos = image_positions(text_len, *grid)
    return img, txt, t, pos, mask


def write_tiny_model_folder(
    root: str | Path,
    layout: str = "diffusers",
    distilled: bool = False,
    scheduler: dict | None = None,
    seed: int = 0,
) -> Path:
    """Write a random tiny whole-model folder like the release (tests and docs, seconds).

    `layout="diffusers"`: transformer/, text_encoder/ (a 36-layer Qwen3-VL of width 16, so
    the release's text taps apply), tokenizer/ (the code-built BPE), vae/ (a tiny
    Qwen-Image VAE, factor 4), scheduler/scheduler_config.json (Krea 2's dynamic shift
    unless `scheduler` is given) and model_index.json naming every component
    (`distilled` -> is_distilled), so diffusers' `Krea2Pipeline.from_pretrained(root)`
    loads it.
    `layout="native"`: one released-format DiT .safetensors beside text_encoder/,
    tokenizer/ and vae/.
    """
    from krea2.dit.config import get_config
    from krea2.dit.model import Krea2DiT
    from krea2.dit.text import TextEncoder
    from krea2.dit.vae import QwenImageVAE
    from krea2.dit.weights import save_weights

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        dit = Krea2DiT(get_config("tiny", text_taps=12, latent_channels=16))
    randomize(dit, seed=seed, std=0.05)
    if layout == "diffusers":
        save_weights(dit, root / "transformer", format="diffusers")
    elif layout == "native":
        save_weights(dit, root / "krea2-tiny.safetensors")
    else:
        raise ValueError(f"layout {layout!r}: choose diffusers or native")
    enc = TextEncoder.tiny(text_dim=16, taps=35, max_length=32, seed=seed)
    enc.model.save_pretrained(root / "text_encoder")
    enc.tokenizer.save_pretrained(root / "tokenizer")
    QwenImageVAE.tiny(seed).vae.save_pretrained(root / "vae")
    if layout == "diffusers":
        (root / "scheduler").mkdir(exist_ok=True)
        conf = scheduler or {
            "_class_name": "FlowMatchEulerDiscreteScheduler",
            "num_train_timesteps": 1000,
            "use_dynamic_shifting": True,
            "time_shift_type": "exponential",
            "base_shift": 0.5,
            "max_shift": 1.15,
            "base_image_seq_len": 256,
            "max_image_seq_len": 6400,
        }
        (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(conf, indent=2))
        index = pipeline_index(root, type(enc.model).__name__, distilled, dit.cfg.patch)
        (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root


def pipeline_index(root: Path, text_encoder: str, distilled: bool, patch: int) -> dict:
    """`model_index.json` of a diffusers pipeline folder naming every component, so that
    `Krea2Pipeline.from_pretrained(root)` loads the folder (offline, nothing downloaded);
    the text encoder (class `text_encoder`) is tapped at the release's layers."""
    import diffusers

    from krea2.dit.text import RELEASE_TAPS

    tokenizer = json.loads((root / "tokenizer" / "tokenizer_config.json").read_text())
    return {
        "_class_name": "Krea2Pipeline",
        "_diffusers_version": diffusers.__version__,
        "is_distilled": distilled,
        "patch_size": patch,
        "text_encoder_select_layers": list(RELEASE_TAPS),
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", text_encoder],
        "tokenizer": ["transformers", tokenizer["tokenizer_class"]],
        "transformer": ["diffusers", "Krea2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }
