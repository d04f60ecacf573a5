"""The ``style`` objective: train a style-reference module on a frozen base.

A stage ``objective = "style"`` adds a :class:`krea2.dit.StyleModule` to the stage's
module and freezes the DiT and text conditioner: only the module trains (one small FSDP
unit; checkpoints hold only it, the base is the stage's start, loaded again on resume).
Each step is flow matching on the batch's images with the module's tokens of one reference
per image in the stream (:mod:`krea2.trainer.style_transforms` decides what the reference
is). The finished stage writes ``style.safetensors`` (the module and its config) beside
its checkpoints, which ``krea2 dit sample --style-module`` and ``krea2 train sample
--style-ref`` read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from krea2.trainer.objective import sample_generator
from krea2.trainer.objectives import ObjectiveSpec
from krea2.trainer.style_settings import StyleSettings
from krea2.trainer.style_transforms import style_references

# sample_generator index space of the references, far from the step's time/noise draws
_REFERENCE = 2**42


class StyleObjective:
    """Flow matching with one reference per image (module docstring)."""

    needs_reference = False

    def __init__(self, settings: StyleSettings) -> None:
        self.settings = settings

    def __call__(
        self,
        run: Any,  # StageRun, DistEnv, JobConfig: not imported, step imports this package
        batch: dict,
        step: int,
        cfg: Any,
        env: Any,
        encode: Callable[[list[str], torch.Tensor], torch.Tensor],
        bad_samples_counter: Any,
    ) -> dict[str, Any]:
        from krea2.trainer.evaluate import to_unit
        from krea2.trainer.step import forward_backward

        s = self.settings
        local = batch["pixels"].shape[0]
        first = env.dp_rank * local
        gens = [sample_generator(cfg.seed, step, _REFERENCE + first + j) for j in range(local)]
        refs = style_references(
            batch["pixels"], s.reference, gens, s.tiles, batch.get("reference_pixels")
        )
        lo, hi = s.strength
        draws = torch.stack([torch.rand(2, generator=g) for g in gens])  # [B, 2]
        strength = lo + (hi - lo) * draws[:, 0]
        strength = torch.where(draws[:, 1] < s.drop, torch.zeros_like(strength), strength)
        # a paired reference is the row's own image (cached under its key); the others are
        # drawn anew each step, so never cached
        keys = [f"{k}#reference" for k in batch["keys"]] if s.reference == "paired" else None
        with torch.no_grad():
            latents = encode(keys, to_unit(refs).to(env.device))
        dtype = next(run.module.dit.parameters()).dtype
        conditioning = {
            "style_refs": latents.to(dtype)[:, None],  # [B, 1, C, h, w]
            "style_strengths": strength[:, None].to(env.device),  # [B, 1]
        }
        out = forward_backward(
            run, batch, step, cfg, env, encode, bad_samples_counter, conditioning=conditioning
        )
        out["reference_strength"] = float(strength.mean())
        return out


def _build(settings: StyleSettings, stage: Any, job: Any) -> StyleObjective:
    return StyleObjective(settings)


STYLE = ObjectiveSpec(
    name="style",
    summary="a style-reference module on the frozen base (flow matching with references)",
    settings=StyleSettings,
    build=_build,
)


__all__ = ["STYLE", "StyleObjective"]
