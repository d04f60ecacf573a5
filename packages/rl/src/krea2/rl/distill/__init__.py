"""krea2.rl.distill: timestep and guidance distillation of a flow DiT into a few-step,
CFG-free student, data-free on prompt shards: TDM (Trajectory Distribution Matching, Turbo's
objective) and DMD2 as its ablation, on ``krea2.trainer``'s loop as the objectives ``tdm``
and ``dmd2`` (docs/rl.md, "Distillation: TDM (Turbo) and DMD2").
"""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports

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
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
