"""krea2.dit: the Krea 2 single-stream DiT, text conditioning, autoencoders and flow sampling.

The names below are the public API. Submodules import torch (and some transformers or
diffusers), so this root imports nothing heavy: each name loads its module on first use
(the `krea2` CLI imports the root).
"""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports
from krea2.infra.quiet import drop_import_notices

drop_import_notices()  # torchao's import-time notices (see krea2.infra.quiet)

__version__ = "0.1.0"

_MODULE_OF = {
    # model and configs
    "Krea2DiT": "model",
    "DiTConfig": "config",
    "CONFIGS": "config",
    "get_config": "config",
    # component registry (docs/architecture.md, contract 6)
    "AUTOENCODERS": "components",
    "TEXT_ENCODERS": "components",
    "ComponentSpec": "components",
    "LatentSpace": "components",
    "parse_autoencoder": "components",
    "parse_text_encoder": "components",
    "latent_space": "components",
    "load_autoencoder": "components",
    "load_text_encoder": "components",
    # autoencoders and text conditioning
    "Autoencoder": "autoencoder",
    "PixelAE": "pixel_ae",
    "to_uint8": "pixel_ae",
    "QwenImageVAE": "vae",
    "Flux2VAE": "vae",
    "TextEncoder": "text",
    "EmbeddingCache": "text",
    "build_tokenizer": "tokenizer",
    # flow (contract 5) and sampling
    "flow": None,
    "TimeShift": "flow",
    "Velocity": "sampler",
    "dit_velocity": "sampler",
    "with_negative": "sampler",
    "with_cfg": "sampler",
    "from_x0": "sampler",
    "euler_step": "sampler",
    "euler_sample": "sampler",
    "seeded_noise": "sampler",
    "generate": "generation",
    "save_pngs": "generation",
    "parse_size": "generation",
    # what `dit sample` samples with: model folders and the weights' own record
    "ModelFolder": "release",
    "read_model_folder": "release",
    "SamplePlan": "sample_plan",
    "plan_sample": "sample_plan",
    # packing latents into tokens
    "patchify": "patches",
    "unpatchify": "patches",
    "image_positions": "patches",
    "resize_patch_weights": "patch_resize",
    "shapes_at_patch": "patch_resize",
    # weights (contract 3)
    "from_pretrained": "weights",
    "load_weights": "weights",
    "save_weights": "weights",
    "convert": "weights",
    "CONDITIONING_KEY": "weights",
    "check_conditioning": "weights",
    "read_conditioning": "weights",
    "is_training_checkpoint": "weights",
    # plans the trainer applies
    "tp_plan": "parallel",
    "tp_partial_params": "parallel",
    "fsdp_units": "parallel",
    "check_tp_degree": "parallel",
    "set_activation_checkpointing": "checkpointing",
    "cost": "flops",
    "param_count": "flops",
    "format_flops": "flops",
}

__all__ = ["__version__", *_MODULE_OF]

__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)
