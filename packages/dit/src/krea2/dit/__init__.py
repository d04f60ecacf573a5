"""krea2.dit: the Krea 2 single-stream DiT, text conditioning, autoencoders and flow sampling.

The names below are the public API. Submodules import torch (and some transformers or
diffusers), so this root imports nothing heavy: each name loads its module on first use
(the `krea2` CLI imports the root).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.dit import flow as flow
    from krea2.dit.attention import set_attention_backend as set_attention_backend
    from krea2.dit.autoencoder import Autoencoder as Autoencoder
    from krea2.dit.checkpointing import set_activation_checkpointing as set_activation_checkpointing
    from krea2.dit.components import AUTOENCODERS as AUTOENCODERS
    from krea2.dit.components import TEXT_ENCODERS as TEXT_ENCODERS
    from krea2.dit.components import ComponentSpec as ComponentSpec
    from krea2.dit.components import LatentSpace as LatentSpace
    from krea2.dit.components import latent_space as latent_space
    from krea2.dit.components import load_autoencoder as load_autoencoder
    from krea2.dit.components import load_text_encoder as load_text_encoder
    from krea2.dit.components import parse_autoencoder as parse_autoencoder
    from krea2.dit.components import parse_text_encoder as parse_text_encoder
    from krea2.dit.conditioning_record import check_conditioning as check_conditioning
    from krea2.dit.config import ATTENTION_BACKENDS as ATTENTION_BACKENDS
    from krea2.dit.config import CONFIGS as CONFIGS
    from krea2.dit.config import DiTConfig as DiTConfig
    from krea2.dit.config import get_config as get_config
    from krea2.dit.expander_client import expand_prompt as expand_prompt
    from krea2.dit.flops import cost as cost
    from krea2.dit.flops import format_flops as format_flops
    from krea2.dit.flops import param_count as param_count
    from krea2.dit.flow import TimeShift as TimeShift
    from krea2.dit.generation import generate as generate
    from krea2.dit.generation import parse_size as parse_size
    from krea2.dit.generation import save_pngs as save_pngs
    from krea2.dit.gguf_weights import read_gguf as read_gguf
    from krea2.dit.gguf_weights import save_gguf as save_gguf
    from krea2.dit.image_requests import RequestLimits as RequestLimits
    from krea2.dit.image_server import ImageServerConfig as ImageServerConfig
    from krea2.dit.image_server import ImageServerThread as ImageServerThread
    from krea2.dit.lora_files import LoraAdapter as LoraAdapter
    from krea2.dit.lora_files import applied as applied
    from krea2.dit.lora_files import load_lora as load_lora
    from krea2.dit.model import Krea2DiT as Krea2DiT
    from krea2.dit.parallel import check_tp_degree as check_tp_degree
    from krea2.dit.parallel import fsdp_units as fsdp_units
    from krea2.dit.parallel import tp_partial_params as tp_partial_params
    from krea2.dit.parallel import tp_plan as tp_plan
    from krea2.dit.patch_resize import resize_patch_weights as resize_patch_weights
    from krea2.dit.patch_resize import shapes_at_patch as shapes_at_patch
    from krea2.dit.patches import image_positions as image_positions
    from krea2.dit.patches import patchify as patchify
    from krea2.dit.patches import unpatchify as unpatchify
    from krea2.dit.pixel_ae import PixelAE as PixelAE
    from krea2.dit.pixel_ae import to_uint8 as to_uint8
    from krea2.dit.release import ModelFolder as ModelFolder
    from krea2.dit.release import read_model_folder as read_model_folder
    from krea2.dit.sample_plan import SamplePlan as SamplePlan
    from krea2.dit.sample_plan import plan_sample as plan_sample
    from krea2.dit.sampler import Velocity as Velocity
    from krea2.dit.sampler import check_style_times as check_style_times
    from krea2.dit.sampler import dit_velocity as dit_velocity
    from krea2.dit.sampler import euler_sample as euler_sample
    from krea2.dit.sampler import euler_step as euler_step
    from krea2.dit.sampler import from_x0 as from_x0
    from krea2.dit.sampler import seeded_noise as seeded_noise
    from krea2.dit.sampler import timed_style as timed_style
    from krea2.dit.sampler import with_cfg as with_cfg
    from krea2.dit.sampler import with_negative as with_negative
    from krea2.dit.served_model import ServedModel as ServedModel
    from krea2.dit.style_cross import STYLE_POOLS as STYLE_POOLS
    from krea2.dit.style_module import StyleConfig as StyleConfig
    from krea2.dit.style_module import StyleModule as StyleModule
    from krea2.dit.style_module import StyleTokens as StyleTokens
    from krea2.dit.style_module import load_style_module as load_style_module
    from krea2.dit.style_module import save_style_module as save_style_module
    from krea2.dit.style_module import style_module_params as style_module_params
    from krea2.dit.style_refs import parse_style_ref as parse_style_ref
    from krea2.dit.style_refs import parse_style_times as parse_style_times
    from krea2.dit.style_refs import style_reference_latents as style_reference_latents
    from krea2.dit.text import EmbeddingCache as EmbeddingCache
    from krea2.dit.text import TextEncoder as TextEncoder
    from krea2.dit.tokenizer import build_tokenizer as build_tokenizer
    from krea2.dit.vae import Flux2VAE as Flux2VAE
    from krea2.dit.vae import QwenImageVAE as QwenImageVAE
    from krea2.dit.weight_quant import quantize_block_linears as quantize_block_linears
    from krea2.dit.weight_quant import stored_bytes as stored_bytes
    from krea2.dit.weights import CONDITIONING_KEY as CONDITIONING_KEY
    from krea2.dit.weights import convert as convert
    from krea2.dit.weights import from_pretrained as from_pretrained
    from krea2.dit.weights import is_training_checkpoint as is_training_checkpoint
    from krea2.dit.weights import load_weights as load_weights
    from krea2.dit.weights import read_conditioning as read_conditioning
    from krea2.dit.weights import save_weights as save_weights
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
    "timed_style": "sampler",
    "check_style_times": "sampler",
    "generate": "generation",
    "save_pngs": "generation",
    "parse_size": "generation",
    # what `dit sample` samples with: model folders and the weights' own record
    "ModelFolder": "release",
    "read_model_folder": "release",
    "SamplePlan": "sample_plan",
    "plan_sample": "sample_plan",
    # serving (`krea2 dit serve`; the `serve` extra)
    "ServedModel": "served_model",
    "ImageServerConfig": "image_server",
    "ImageServerThread": "image_server",
    "RequestLimits": "image_requests",
    "expand_prompt": "expander_client",
    # style references (docs/architecture.md, contract 9)
    "STYLE_POOLS": "style_cross",
    "StyleConfig": "style_module",
    "StyleTokens": "style_module",
    "StyleModule": "style_module",
    "save_style_module": "style_module",
    "load_style_module": "style_module",
    "style_module_params": "style_module",
    "parse_style_ref": "style_refs",
    "parse_style_times": "style_refs",
    "style_reference_latents": "style_refs",
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
    "check_conditioning": "conditioning_record",
    "read_conditioning": "weights",
    "is_training_checkpoint": "weights",
    "save_gguf": "gguf_weights",
    "read_gguf": "gguf_weights",
    # at sampling time: LoRA files by hooks, weight-only quantization
    "LoraAdapter": "lora_files",
    "load_lora": "lora_files",
    "applied": "lora_files",
    "quantize_block_linears": "weight_quant",
    "stored_bytes": "weight_quant",
    # plans the trainer applies
    "tp_plan": "parallel",
    "tp_partial_params": "parallel",
    "fsdp_units": "parallel",
    "check_tp_degree": "parallel",
    "set_activation_checkpointing": "checkpointing",
    "ATTENTION_BACKENDS": "config",
    "set_attention_backend": "attention",
    "cost": "flops",
    "param_count": "flops",
    "format_flops": "flops",
}

__all__ = ["__version__", *_MODULE_OF]

__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)
