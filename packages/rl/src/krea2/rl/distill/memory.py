"""Memory per GPU of a distillation stage (TDM or DMD2): the teacher, the student and the
fake score held at once, sharded with FSDP over N GPUs. A projection from the DiT config
with the trainer's fine-tuning model (:func:`krea2.trainer.finetune_memory`), nothing
measured; docs/rl.md holds the krea2-12b table (``krea2 rl distill-memory`` prints it).

Per GPU, in GiB, the parts :class:`~krea2.trainer.FinetuneMemory` names, with
the models a layout keeps:

- ``full`` student + ``copy`` fake (built): the frozen teacher in bf16, and two trained
  DiTs (fp32 master, gradient, two AdamW moments: 16 B per parameter each);
- ``full`` student + ``lora`` fake (built): the teacher, the trained student, and the
  fake's frozen copy of the teacher in bf16 with rank-r adapters;
- ``lora`` student + ``adapter`` fake on one base (``[stages.lora]`` and ``fake =
  "adapter"``, built): one frozen bf16 base that is the teacher with the adapters off, and
  two adapter sets (student and fake).

Activations are one backward's (the fake and student updates run one after the other;
the teacher's forward keeps none); gathered FSDP units are two per module in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from krea2.dit.config import DiTConfig

# (student, fake score) layouts, in the order of the table
LAYOUTS = (("full", "copy"), ("full", "lora"), ("lora", "adapter"))
H200_GIB = 141e9 / 2**30  # 141 GB of HBM3e


@dataclass(frozen=True)
class DistillMemory:
    """GiB per GPU by part for one (student, fake) layout."""

    student: str
    fake: str
    gpus: int
    weights_gib: float  # every model's weights (fp32 masters of trained DiTs, bf16 frozen)
    trainable_gib: float  # gradients and AdamW moments (and adapters' fp32 weights)
    gathered_gib: float
    activations_gib: float
    encoders_gib: float
    runtime_gib: float

    @property
    def total_gib(self) -> float:
        return (self.weights_gib + self.trainable_gib + self.gathered_gib
                + self.activations_gib + self.encoders_gib + self.runtime_gib)  # fmt: skip


def distill_memory(
    cfg: DiTConfig,
    student: str,
    fake: str,
    gpus: int,
    side: int = 1024,
    batch: int = 1,
    rank: int = 64,
) -> DistillMemory:
    """Per-GPU memory of a distillation stage with a ``student`` ("full" or "lora") and a
    ``fake`` score ("copy", "lora" or "adapter": one of ``LAYOUTS``) on ``gpus`` FSDP
    ranks, ``batch`` prompts of ``side``^2 pixels per GPU, adapters of ``rank``."""
    from krea2.trainer import finetune_memory

    if (student, fake) not in LAYOUTS:
        raise ValueError(f"(student, fake) = {(student, fake)} is not one of {LAYOUTS}")
    full = finetune_memory(cfg, "full", "bf16", gpus, side, batch, rank)
    lora = finetune_memory(cfg, "lora", "bf16", gpus, side, batch, rank)
    frozen = lora.base_gib  # one bf16 copy of the DiT, sharded
    if (student, fake) == ("full", "copy"):
        weights = frozen + 2 * full.base_gib
        trainable, gathered = 2 * full.trainable_gib, 2 * full.gathered_gib
    elif (student, fake) == ("full", "lora"):
        weights = 2 * frozen + full.base_gib
        trainable = full.trainable_gib + lora.trainable_gib
        gathered = full.gathered_gib + lora.gathered_gib
    else:  # one frozen base: the teacher with the adapters off, and two adapter sets
        weights, trainable, gathered = frozen, 2 * lora.trainable_gib, lora.gathered_gib
    return DistillMemory(
        student=student, fake=fake, gpus=gpus, weights_gib=weights, trainable_gib=trainable,
        gathered_gib=gathered, activations_gib=full.activations_gib,
        encoders_gib=full.encoders_gib, runtime_gib=full.runtime_gib,
    )  # fmt: skip


def memory_table(
    cfg: DiTConfig, gpus=(1, 8, 64), side: int = 1024, rank: int = 64, batch: int = 1
) -> str:
    """The Markdown table of :func:`distill_memory` for every layout on each GPU count,
    with whether it fits an H200 (141 GB)."""
    lines = [
        "| student | fake score | GPUs | weights | grads + AdamW | gathered "
        "| activations | encoders | runtime | total GiB/GPU | fits an H200 |",
        "|" + " --- |" * 11,
    ]
    for student, fake in LAYOUTS:
        for n in gpus:
            m = distill_memory(cfg, student, fake, n, side, batch, rank)
            name = f"LoRA r{rank}" if student == "lora" else "full"
            fake_name = {"copy": "full copy", "lora": f"LoRA r{rank} on a frozen copy",
                         "adapter": f"LoRA r{rank} on the student's base"}[fake]  # fmt: skip
            lines.append(
                f"| {name} | {fake_name} | {n} | {m.weights_gib:.1f} "
                f"| {m.trainable_gib:.1f} | {m.gathered_gib:.2f} | {m.activations_gib:.2f} "
                f"| {m.encoders_gib:.1f} | {m.runtime_gib:.0f} | **{m.total_gib:.1f}** "
                f"| {'yes' if m.total_gib <= H200_GIB else 'no'} |"
            )
    return "\n".join(lines)
