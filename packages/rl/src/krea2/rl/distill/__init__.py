"""krea2.rl.distill: timestep and guidance distillation of a flow DiT into a few-step,
CFG-free student, data-free on prompt shards: TDM (Trajectory Distribution Matching, Turbo's
objective) and DMD2 as its ablation, on ``krea2.trainer``'s loop as the objectives ``tdm``
and ``dmd2`` (docs/rl.md, "Distillation: TDM (Turbo) and DMD2").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.rl.distill.config import Distance as Distance
    from krea2.rl.distill.config import DistillMode as DistillMode
    from krea2.rl.distill.config import FakeScoreKind as FakeScoreKind
    from krea2.rl.distill.config import Intervals as Intervals
    from krea2.rl.distill.config import TdmConfig as TdmConfig
    from krea2.rl.distill.fake_score import FakeScore as FakeScore
    from krea2.rl.distill.loss import TeacherTerms as TeacherTerms
    from krea2.rl.distill.loss import dmd_normaliser as dmd_normaliser
    from krea2.rl.distill.loss import fake_score_loss as fake_score_loss
    from krea2.rl.distill.loss import importance_weight as importance_weight
    from krea2.rl.distill.loss import krea_guidance as krea_guidance
    from krea2.rl.distill.loss import noise_from_velocity as noise_from_velocity
    from krea2.rl.distill.loss import normalised_dmd_gradient as normalised_dmd_gradient
    from krea2.rl.distill.loss import pseudo_huber as pseudo_huber
    from krea2.rl.distill.loss import snr_weight as snr_weight
    from krea2.rl.distill.loss import student_loss as student_loss
    from krea2.rl.distill.loss import teacher_terms as teacher_terms
    from krea2.rl.distill.loss import x0_from_velocity as x0_from_velocity
    from krea2.rl.distill.memory import DistillMemory as DistillMemory
    from krea2.rl.distill.memory import distill_memory as distill_memory
    from krea2.rl.distill.objective import TdmObjective as TdmObjective
    from krea2.rl.distill.stage import check_distill_stage as check_distill_stage
    from krea2.rl.distill.train import TURBO_STAGE as TURBO_STAGE
    from krea2.rl.distill.train import distill_job as distill_job
    from krea2.rl.distill.train import train_distill as train_distill
    from krea2.rl.distill.trajectory import StagePoints as StagePoints
    from krea2.rl.distill.trajectory import draw_points as draw_points
    from krea2.rl.distill.trajectory import pick_inputs as pick_inputs
    from krea2.rl.distill.trajectory import renoise as renoise
    from krea2.rl.distill.trajectory import rollout_inputs as rollout_inputs
    from krea2.rl.distill.trajectory import stage_intervals as stage_intervals

_HOMES: dict[str, str | None] = {
    # settings
    "TdmConfig": "config",
    "DistillMode": "config",
    "Intervals": "config",
    "FakeScoreKind": "config",
    "Distance": "config",
    # the student's trajectory
    "stage_intervals": "trajectory",
    "StagePoints": "trajectory",
    "draw_points": "trajectory",
    "renoise": "trajectory",
    "rollout_inputs": "trajectory",
    "pick_inputs": "trajectory",
    # loss pieces
    "krea_guidance": "loss",
    "x0_from_velocity": "loss",
    "noise_from_velocity": "loss",
    "pseudo_huber": "loss",
    "dmd_normaliser": "loss",
    "TeacherTerms": "loss",
    "teacher_terms": "loss",
    "student_loss": "loss",
    "normalised_dmd_gradient": "loss",
    "snr_weight": "loss",
    "importance_weight": "loss",
    "fake_score_loss": "loss",
    # training
    "FakeScore": "fake_score",
    "TdmObjective": "objective",
    "check_distill_stage": "stage",
    "distill_job": "train",
    "train_distill": "train",
    "TURBO_STAGE": "train",
    # memory projection (krea2 rl distill-memory)
    "DistillMemory": "memory",
    "distill_memory": "memory",
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
