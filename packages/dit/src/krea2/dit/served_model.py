"""A model folder loaded for serving: its settings as `krea2 dit sample` resolves them, and
one call that samples a batch of images of one shape with their own seeds.

The folder is read by :func:`krea2.dit.sample_plan.plan_sample` twice, as given and with
Turbo's settings, so a request's ``turbo`` flag, steps and CFG default exactly as the
sampler's flags do (a folder marked distilled samples in its own steps without CFG either
way). A ``style.safetensors`` beside the DiT is loaded once and enables style references;
LoRA adapters given by name at load are applied per call at the scales a request names
(:mod:`krea2.dit.lora_files`: hooks, the base weights untouched).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from krea2.dit.sample_plan import SamplePlan, plan_sample

if TYPE_CHECKING:
    from PIL import Image

    from krea2.dit.autoencoder import Autoencoder
    from krea2.dit.lora_files import LoraAdapter
    from krea2.dit.model import Krea2DiT
    from krea2.dit.style_module import StyleModule, StyleTokens
    from krea2.dit.text import TextEncoder


@dataclass(frozen=True)
class Shape:
    """What the images of one sampling call share: the dynamic-batching key. ``negative``
    is "" without CFG (it is not used then); ``style`` identifies the references and their
    strengths ("" for none), which every image of the call shares; ``loras`` the (name,
    scale) adapters applied, in the request's order; ``style_times`` the (lo, hi) flow
    times the references act at (None: every step)."""

    width: int
    height: int
    steps: int
    cfg: float
    turbo: bool = False
    negative: str = ""
    style: str = ""
    loras: tuple[tuple[str, float], ...] = ()
    style_times: tuple[float, float] | None = None

    def __str__(self) -> str:
        guidance = f"CFG {self.cfg:g}" if self.cfg else "no CFG"
        extra = (", turbo" if self.turbo else "") + (", style" if self.style else "")
        if self.style and self.style_times is not None:
            extra += f" at t {self.style_times[0]:g}:{self.style_times[1]:g}"
        extra += "".join(f", LoRA {name} x{scale:g}" for name, scale in self.loras)
        return f"{self.width}x{self.height}, {self.steps} steps, {guidance}{extra}"


@dataclass
class ServedModel:
    """The parts of a loaded model folder (see the module docstring)."""

    name: str
    plan: SamplePlan
    turbo_plan: SamplePlan
    net: Krea2DiT
    encoder: TextEncoder
    ae: Autoencoder
    style_module: StyleModule | None = None
    loras: dict[str, LoraAdapter] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        model: str | Path,
        *,
        text_tokens: int | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        loras: dict[str, Path] | None = None,
        quant: str = "none",
    ) -> ServedModel:
        """Load the model folder ``model`` (diffusers or native release layout) on
        ``device`` in ``dtype``, with the LoRA adapter files ``loras`` (name -> file or
        diffusers folder), its block Linears weight-only quantized when ``quant`` is int8
        or float8 (:mod:`krea2.dit.weight_quant`); ``text_tokens`` overrides the text length
        T (default: the weights' record, else 512). UserError for what `krea2 dit sample`
        refuses and for an adapter that does not fit the model."""
        from krea2.dit.components import load_autoencoder, load_text_encoder
        from krea2.dit.lora_files import load_lora
        from krea2.dit.style_module import load_style_module
        from krea2.dit.weight_quant import quantize_block_linears
        from krea2.dit.weights import from_pretrained

        plan = plan_sample(model=Path(model), text_tokens=text_tokens)
        turbo_plan = plan_sample(model=Path(model), text_tokens=text_tokens, turbo=True)
        net = from_pretrained(plan.weights, dtype=dtype, device=device)
        quantize_block_linears(net, quant, device)
        encoder = load_text_encoder(plan.text_encoder, net.cfg, plan.text_tokens, dtype, device)
        ae = load_autoencoder(plan.autoencoder, dtype, device)
        style = None
        if plan.style_module is not None:
            style = load_style_module(plan.style_module, net.cfg, device=device, dtype=dtype)
        adapters = {}
        for name, path in (loras or {}).items():
            adapter = load_lora(path, name)
            adapter.check_fits(net)
            adapters[name] = adapter.to(device, dtype)
        return cls(Path(model).name, plan, turbo_plan, net, encoder, ae, style, adapters)

    @property
    def size_multiple(self) -> int:
        """Widths and heights must be multiples of this (autoencoder factor x patch)."""
        return self.ae.spatial_factor * self.net.cfg.patch

    @property
    def style_slots(self) -> int:
        """How many style references a request may give (0: no style module)."""
        return self.style_module.cfg.max_refs if self.style_module is not None else 0

    def defaults(self, turbo: bool) -> tuple[int, float]:
        """(steps, cfg) of a request that names neither."""
        plan = self.turbo_plan if turbo else self.plan
        return plan.steps, plan.cfg

    def render(
        self,
        shape: Shape,
        prompts: Sequence[str],
        seeds: Sequence[int],
        refs: Sequence[tuple[Image.Image, float]] = (),
        batch_size: int | None = None,
    ) -> np.ndarray:
        """uint8 images [B, H, W, 3], image i from ``prompts[i]`` and ``seeds[i]`` (it does
        not depend on the others, up to the float rounding of batched kernels); ``refs``:
        the (image, strength) style references every image shares; ``shape.loras`` the
        loaded adapters applied, at their scales, for this call only."""
        from krea2.dit.generation import generate
        from krea2.dit.lora_files import applied
        from krea2.dit.pixel_ae import to_uint8

        plan = self.turbo_plan if shape.turbo else self.plan
        adapters = [(self.loras[name], scale) for name, scale in shape.loras]
        with applied(self.net, adapters):
            images = generate(
                self.net,
                self.encoder,
                self.ae,
                prompts,
                shape.width,
                shape.height,
                steps=shape.steps,
                cfg=shape.cfg,
                mu=plan.time_shift,
                negative=shape.negative,
                prediction=plan.prediction,
                x0_min_t=plan.x0_min_t,
                batch_size=batch_size,
                style=self._style_tokens(refs, (shape.width, shape.height)),
                style_times=shape.style_times,
                seeds=seeds,
            )
        return to_uint8(images).numpy()

    def _style_tokens(
        self, refs: Sequence[tuple[Image.Image, float]], size: tuple[int, int]
    ) -> StyleTokens | None:
        """The one-image style tokens of ``refs`` (None without references or when every
        strength is 0: the exact path without style)."""
        if not refs or self.style_module is None:
            return None
        from krea2.dit.style_refs import reference_tokens

        return reference_tokens(self.style_module, refs, self.ae, size)
