"""Build a stage's trainable module (DiT + text conditioner + iREPA head) and parallelize it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from krea2.infra.errors import UserError
from krea2.infra.logging import get_logger
from krea2.trainer.config import (
    Autocast,
    InitDevice,
    JobConfig,
    LoraConfig,
    ModelConfig,
    StageConfig,
)
from krea2.trainer.distributed import DistEnv, cpu_has_fast_bf16
from krea2.trainer.model_shape import dit_config
from krea2.trainer.objective import Parameterization
from krea2.trainer.style_settings import (
    build_style_module,
    continued_style_module,
    style_settings_of,
    trains_style_only,
)
from krea2.trainer.validate import autoencoder_spec

log = get_logger("trainer.build")


class TrainModule(nn.Module):
    """Everything trained together: ``dit`` (Krea2DiT), ``text`` (conditioner), ``irepa``
    (projector head, only while iREPA is on), ``style`` (a style-reference module, in a
    ``style`` stage). One root, so FSDP's hooks wrap one forward."""

    def __init__(
        self,
        dit: nn.Module,
        text: nn.Module,
        irepa: nn.Module | None,
        autocast: torch.dtype | None = None,
        output: Parameterization = Parameterization(),
    ) -> None:
        super().__init__()
        self.output = output  # what the DiT's output means, and how it becomes v
        self.dit = dit
        self.text = text
        self.irepa = irepa
        self.autocast = autocast  # forward's torch.autocast dtype (None: off)
        self.irepa_layer: int | None = None
        self._tap: Tensor | None = None
        self.style: nn.Module | None = None

    def set_irepa(self, layer: int | None) -> None:
        """Capture block ``layer``'s output for the iREPA loss (None: off)."""
        if self.irepa_layer is not None:
            self._handle.remove()
        self.irepa_layer = layer
        if layer is not None:
            self._handle = self.dit.blocks[layer].register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        self._tap = output

    def forward(
        self,
        x_t: Tensor,
        t: Tensor,
        captions: list[str],
        irepa_target: Tensor | None = None,
        style_refs: Tensor | None = None,
        style_strengths: Tensor | None = None,
        style_tokens: Any = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x_t [B, C, H, W] noised latents, t [B], captions (B strings) ->
        (velocity [B, C, H, W], iREPA loss (scalar) or None).

        ``irepa_target`` [B, enc_dim, H/p, W/p]: encoder patch features of the clean image.
        ``style_refs`` [B, R, C, h, w] reference latents with ``style_strengths`` [B, R]
        (>= 0): the style module's tokens join the stream (needs ``self.style``);
        ``style_tokens``: those tokens already made (``StyleTokens``; sampling makes them
        once, not at every step).
        """
        enabled = self.autocast is not None
        with torch.autocast(x_t.device.type, dtype=self.autocast, enabled=enabled):
            txt, mask = self.text(captions)
            txt = txt.to(x_t.dtype)
            style = style_tokens
            if style_refs is not None:
                if self.style is None:
                    raise UserError("style references given to a module without a style module")
                # training keeps all: every rank's module gets a gradient, also when all
                # its rows are at strength 0 (FSDP2 skips the reduce-scatter of a unit
                # without one); sampling drops a reference at 0, so s = 0 is exact
                style = self.style(style_refs, style_strengths, keep_all=self.training)
            v = self.dit.velocity(x_t, txt, t, mask, style=style)
            aux = None
            if irepa_target is not None and self._tap is not None:
                n = irepa_target.shape[2] * irepa_target.shape[3]
                tokens = self._tap[:, txt.shape[1] : txt.shape[1] + n]
                aux = self.irepa(tokens, irepa_target).float()
        self._tap = None
        return self.output.velocity(v.to(x_t.dtype), x_t, t), aux


def build_autoencoder(model: ModelConfig, device: torch.device) -> nn.Module:
    """The job's frozen autoencoder on ``device`` (replicated on every rank)."""
    from krea2.dit.components import load_autoencoder

    return load_autoencoder(autoencoder_spec(model), device=device)


def build_module(
    cfg: JobConfig,
    stage: StageConfig,
    env: DistEnv,
    adapters: Mapping[str, LoraConfig] | None = None,
) -> TrainModule:
    """Seeded build (every layout starts from identical weights), then float8 -> TP -> AC ->
    compile -> FSDP (each unit, then the root). ``adapters``: LoRA adapters by peft name
    that the stage's objective trains itself beside a LoRA stage's own (TDM's fake score:
    :func:`krea2.trainer.objectives.objective_adapters`), injected with it before sharding."""
    import krea2.trainer.parallelize as par
    from krea2.dit import set_attention_backend
    from krea2.dit.flops import param_count
    from krea2.dit.model import Krea2DiT
    from krea2.dit.parallel import fsdp_units
    from krea2.trainer.irepa import IrepaHead
    from krea2.trainer.text import build_text

    dcfg = dit_config(cfg, stage)
    meta = cfg.model.init_device is InitDevice.META or (
        cfg.model.init_device is InitDevice.AUTO and param_count(dcfg) > 2_000_000_000
    )
    torch.manual_seed(cfg.seed)
    with torch.device("meta") if meta else contextlib.nullcontext():
        dit = Krea2DiT(dcfg)
    text = build_text(cfg.text, dcfg, cfg.seed, cfg.data.cache_dir)
    head = None
    if stage.irepa.steps > 0:
        head = IrepaHead(dcfg.width, irepa_encoder_dim(stage))
    style_settings = style_settings_of(stage)
    if trains_style_only(stage):
        # only the style module trains; the base is the stage's start (warm_start), which
        # checkpoints do not hold, like a LoRA stage's
        dit.requires_grad_(False)
        text.requires_grad_(False)
    if stage.lora.enabled:
        # Adapters go in before sharding, so each block's FSDP unit holds its adapters;
        # the base (and the text conditioner) stay frozen. Base weights are loaded later
        # (krea2.trainer.warmstart), also on resume: checkpoints hold only the adapters.
        from krea2.trainer.basequant import check_base_quant
        from krea2.trainer.lora import apply_lora

        check_base_quant(cfg.model.base_quant, env.device, env.distributed)
        targets = apply_lora(dit, stage.lora)
        for name, extra in (adapters or {}).items():
            apply_lora(dit, extra, adapter=name)
        text.requires_grad_(False)
        log.info("stage %s: LoRA rank %d on %d Linears", stage.name, stage.lora.rank, len(targets))
    elif adapters:
        raise ValueError(f"adapters {sorted(adapters)} need a LoRA stage (stage.lora)")
    dtype = getattr(torch, cfg.model.dtype.value)
    if not env.distributed and not meta:
        _to_dtype(dit, dtype)
    par.apply_float8(dit, stage.float8, stage.float8_emulate, fsdp=env.distributed)
    text.to(env.device)
    if head is not None:
        head.to(env.device)
    if not meta:
        dit.to(env.device)
    module = TrainModule(
        dit,
        text,
        head,
        autocast_dtype(cfg.model.autocast, env),
        parameterization(cfg, stage),
    )
    if style_settings is not None:
        module.style = build_style_module(style_settings, dcfg, cfg.seed).to(env.device)
    elif stage.style_from:
        module.style = continued_style_module(cfg.run_dir, stage, dcfg).to(env.device)
    if env.tp > 1:
        par.apply_tp(dit, env.mesh["tp"], stage.float8, cfg.parallel.async_tp)
    par.apply_ac(dit, stage.checkpointing)
    set_attention_backend(dit, cfg.model.attention)
    if stage.compile:
        par.apply_compile(dit, stage.compile_backend)
    if env.distributed:
        param_dtype = torch.bfloat16 if env.device.type == "cuda" else None
        units = [*fsdp_units(dit), text] + [m for m in (head, module.style) if m is not None]
        cross = getattr(module.style, "cross", None)
        if cross is not None:  # the DiT calls them after the module's forward: own units
            units = [*units[:-1], *cross, units[-1]]
        units = [u for u in units if any(p.requires_grad for p in u.parameters())]
        par.apply_fsdp(units, module, env.mesh["dp"], param_dtype)
    if meta:
        # Materialise the (sharded) parameters on the device and initialise them there;
        # random init of DTensors draws each shard from its slice of one global stream.
        dit.to_empty(device=env.device)
        torch.manual_seed(cfg.seed)
        with torch.no_grad():
            dit.init_weights()
            if stage.lora.enabled:
                from krea2.trainer.lora import reset_lora

                reset_lora(dit)  # init_weights gave the adapters' Linears their default init
        if not env.distributed:
            _to_dtype(dit, dtype)
    return module


def _to_dtype(dit: nn.Module, dtype: torch.dtype) -> None:
    """Cast the DiT to ``dtype`` on one device, LoRA adapters excepted: they train in fp32
    on a bf16 base (peft casts each adapter's input to its dtype and its output back)."""
    dit.to(dtype)
    for name, p in dit.named_parameters():
        if p.requires_grad and (".lora_A." in name or ".lora_B." in name):
            p.data = p.data.float()


def parameterization(cfg: JobConfig, stage: StageConfig) -> Parameterization:
    """What the DiT's output means in ``stage`` (its patch against the model's)."""
    return Parameterization.for_patches(
        cfg.model.prediction,
        cfg.model.x0_min_t,
        dit_config(cfg).patch,
        dit_config(cfg, stage).patch,
        f"stage {stage.name!r}",
    )


def autocast_dtype(mode: Autocast, env: DistEnv) -> torch.dtype | None:
    """The forward's autocast dtype for ``ModelConfig.autocast`` on this layout."""
    if mode is Autocast.NONE:
        return None
    if mode is Autocast.BFLOAT16:
        return torch.bfloat16
    if env.distributed and env.device.type == "cuda":
        return None  # FSDP's MixedPrecisionPolicy already runs the forward in bf16
    if env.device.type == "cuda":
        return torch.bfloat16
    if env.device.type == "cpu" and cpu_has_fast_bf16():
        return torch.bfloat16
    return None  # bf16 emulated, or Intel's avx512_bf16 without AMX, is slower than fp32


def irepa_encoder_dim(stage: StageConfig) -> int:
    if stage.irepa.encoder == "tiny":
        return stage.irepa.encoder_dim
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(stage.irepa.encoder.removeprefix("hf:")).hidden_size)


def check_bucket(bucket_size: tuple[int, int], factor: int, where: str) -> None:
    w, h = bucket_size
    if w % factor or h % factor:
        raise UserError(
            f"{where}: bucket {w}x{h} is not divisible by autoencoder factor x patch = {factor}"
        )
