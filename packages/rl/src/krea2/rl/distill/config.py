"""The distillation settings: a ``tdm`` or ``dmd2`` stage's ``[stages.settings]`` table.

Units. Times are flow times (t = 1 is noise, contract 5). ``huber_c`` is in latent units
per element: the Pseudo-Huber distance is taken element by element, as TDM does, so ``c``
does not grow with the latent's size; krea2's latents have about unit variance (the pixel
autoencoder's are pixels in [-1, 1]), so c = 1e-3 makes the loss L1-like on any error
above a thousandth of the signal. ``teacher_guidance`` is Ho's guidance scale g
(v = v_u + g·(v_c − v_u); 1 is no guidance), the convention of TDM, DMD and most papers;
krea2's own CFG is v = v_c + w·(v_c − v_u), so the teacher runs at w = g − 1
(:func:`krea2.rl.distill.loss.krea_guidance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DistillMode(StrEnum):
    """``tdm``: trajectory distribution matching, every student step matched in its own
    time interval; ``dmd2``: one fake score over all times (the ablation)."""

    TDM = "tdm"
    DMD2 = "dmd2"


class Intervals(StrEnum):
    """Where TDM queries the scores for a sample of student step k: ``disjoint`` (in step
    k's own interval of the student's grid, TDM's ``use_separate``) or ``shared`` (from
    that interval's start up to t = 1)."""

    DISJOINT = "disjoint"
    SHARED = "shared"


class FakeScoreKind(StrEnum):
    """The fake score: ``copy`` (a full copy of the DiT, trained), ``lora`` (peft LoRA
    adapters of rank ``fake_lora_rank`` on a frozen copy of the teacher) or ``adapter``
    (a second adapter of rank ``fake_lora_rank`` on a LoRA student's own frozen base, which
    with both adapters off is the teacher: one copy of the DiT for all three models)."""

    COPY = "copy"
    LORA = "lora"
    ADAPTER = "adapter"


class Distance(StrEnum):
    """The student's regression distance: ``pseudo_huber`` (TDM's ``use_huber``, with
    ``huber_c``) or ``squared`` (TDM's and DMD's squared error)."""

    PSEUDO_HUBER = "pseudo_huber"
    SQUARED = "squared"


DEFAULT_FAKE_UPDATES = {DistillMode.TDM: 1, DistillMode.DMD2: 5}


@dataclass
class TdmConfig:
    """One distillation stage (docs/rl.md, "Distillation: TDM (Turbo) and DMD2").

    Student: ``student_steps`` Euler steps (K) on the stage's time grid, no CFG. Each
    iteration rolls it out without gradient, picks a step k per sample, and trains the
    student's one-step prediction x̂0 from that step's input.

    Scores: the teacher (the stage's frozen start, CFG at ``teacher_guidance`` in Ho's
    convention) and the fake score (``fake``: ``copy``, ``lora`` or, for a LoRA student
    (``[stages.lora]``), ``adapter``: teacher, student and fake on one base) are queried at x̂0
    re-noised: for ``mode = "tdm"`` first along the student's own ODE to a time s in step
    k's interval (uniform there with ``random_mid``, else its end), then with fresh noise to
    a time τ ≥ s in that interval (``intervals = "disjoint"``) or up to 1 (``shared``); for
    ``mode = "dmd2"`` with fresh noise to τ uniform in (0, 1). The fake score learns the
    student's samples by x0-space MSE weighted by min(SNR, ``snr_cap``) and, for TDM's
    mixed noise, by ``importance_weights`` clipped at ``weight_clip``; it takes
    ``fake_updates`` AdamW steps (lr ``fake_lr``; None: the stage's lr) per student step
    (None: 1 for tdm, 5 for dmd2, DMD2's two-time-scale ratio).

    Student loss: ``distance`` (``pseudo_huber`` with ``huber_c``, or ``squared``) to the
    stop-gradient
    target x̂0 + Δ, divided by mean |x̂0 − x0_teacher_cfg| per sample (DMD's normaliser),
    Δ = x0_teacher_cfg − x0_fake; with ``split_teacher_term`` (decoupled DMD)
    Δ = ``cfg_weight``·(g − 1)(x0_cond − x0_uncond) + ``dm_weight``·(x0_cond − x0_fake).
    """

    mode: DistillMode = DistillMode.TDM
    student_steps: int = 4
    intervals: Intervals = Intervals.DISJOINT
    random_mid: bool = True
    fake: FakeScoreKind = FakeScoreKind.COPY
    fake_lora_rank: int = 16
    fake_updates: int | None = None
    fake_lr: float | None = None
    snr_cap: float = 5.0
    importance_weights: bool = True
    weight_clip: float = 2.0
    distance: Distance = Distance.PSEUDO_HUBER
    huber_c: float = 1e-3
    teacher_guidance: float = 4.0
    split_teacher_term: bool = False
    cfg_weight: float = 1.0
    dm_weight: float = 1.0

    def __post_init__(self) -> None:
        self.mode = DistillMode(self.mode)
        self.intervals = Intervals(self.intervals)
        self.fake = FakeScoreKind(self.fake)
        self.distance = Distance(self.distance)
        if self.fake_updates is None:
            self.fake_updates = DEFAULT_FAKE_UPDATES[self.mode]
        for name in ("student_steps", "fake_updates", "fake_lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.fake_lr is not None and not self.fake_lr > 0:
            raise ValueError(f"fake_lr={self.fake_lr} must be > 0 (or unset: the stage's lr)")
        if not self.huber_c > 0:
            raise ValueError(f'huber_c={self.huber_c} must be > 0 (distance = "squared": none)')
        if not self.teacher_guidance >= 1:
            raise ValueError(
                f"teacher_guidance={self.teacher_guidance} is Ho's g (1 = no guidance); "
                f"krea2's CFG scale w is g - 1, so w={self.teacher_guidance:g} is "
                f"teacher_guidance={self.teacher_guidance + 1:g}"
            )
        if not self.weight_clip > 0:
            raise ValueError(f"weight_clip={self.weight_clip} must be > 0")
        if not self.snr_cap > 0:
            raise ValueError(f"snr_cap={self.snr_cap} must be > 0")
        for name in ("cfg_weight", "dm_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if not self.split_teacher_term and (self.cfg_weight, self.dm_weight) != (1.0, 1.0):
            raise ValueError(
                f"cfg_weight={self.cfg_weight}, dm_weight={self.dm_weight} weigh the split "
                "terms; set split_teacher_term = true to use them"
            )

    @property
    def huber(self) -> float | None:
        """The Pseudo-Huber c of the student loss; None: the squared error."""
        return self.huber_c if self.distance is Distance.PSEUDO_HUBER else None

    @property
    def krea_guidance(self) -> float:
        """The teacher's CFG scale in krea2's convention, w = g − 1."""
        return self.teacher_guidance - 1.0
