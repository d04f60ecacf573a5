"""What a ``tdm`` or ``dmd2`` stage needs of its trainer stage, checked before any work."""

from __future__ import annotations

from typing import Any

from krea2.infra.errors import UserError


def check_distill_stage(stage: Any, where: str, dp: int) -> None:
    """UserError (naming ``where``, e.g. ``stages.6``) for what distillation cannot train:
    a LoRA student whose fake score is not its second adapter (``settings.fake =
    "adapter"``: the teacher is the student's base with the adapters off, so a separate
    teacher or fake copy would only cost memory), an ``adapter`` fake score without a LoRA
    student, and a global batch that does not split evenly over the ``dp`` ranks (every
    rank rolls out its own prompts and runs the same forwards)."""
    from krea2.rl.distill.config import FakeScoreKind
    from krea2.trainer.objectives import stage_settings

    fake = stage_settings(stage, where).fake
    if stage.lora.enabled and fake is not FakeScoreKind.ADAPTER:
        raise UserError(
            f'{where}.settings.fake="{fake}" with a LoRA student ({where}.lora.rank='
            f"{stage.lora.rank}): the fake score of a LoRA student is a second adapter on "
            f'its base; set {where}.settings.fake = "adapter" (or remove {where}.lora to '
            "train the whole student)"
        )
    if fake is FakeScoreKind.ADAPTER and not stage.lora.enabled:
        raise UserError(
            f'{where}.settings.fake="adapter" puts the fake score on a LoRA student\'s base, '
            f"but the stage trains the whole student; add {where}.lora (e.g. rank = 64) or "
            'choose fake = "copy" or "lora"'
        )
    if stage.batch_size % dp:
        raise UserError(
            f"{where}.batch_size={stage.batch_size} does not split over {dp} data-parallel "
            f"ranks; make it a multiple of {dp}"
        )
