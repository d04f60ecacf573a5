"""What a ``tdm`` or ``dmd2`` stage needs of its trainer stage, checked before any work."""

from __future__ import annotations

from typing import Any

from krea2.infra.errors import UserError


def check_distill_stage(stage: Any, where: str, dp: int) -> None:
    """UserError (naming ``where``, e.g. ``stages.6``) for what distillation cannot train:
    a LoRA student (the objective trains the whole student; the fake score may be a LoRA,
    ``settings.fake = "lora"``), and a global batch that does not split evenly over the
    ``dp`` ranks (every rank rolls out its own prompts and runs the same forwards)."""
    if stage.lora.enabled:
        raise UserError(
            f"{where}.lora.rank={stage.lora.rank}: a LoRA student is not built yet for "
            f"objective {stage.objective!r}; remove {where}.lora (the fake score can be a "
            'LoRA: settings.fake = "lora")'
        )
    if stage.batch_size % dp:
        raise UserError(
            f"{where}.batch_size={stage.batch_size} does not split over {dp} data-parallel "
            f"ranks; make it a multiple of {dp}"
        )
