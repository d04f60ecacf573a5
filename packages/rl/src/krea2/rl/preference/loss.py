"""Diffusion-DPO and STPO on flow-matching velocity errors: the loss of a batch of pairs."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


class PreferenceKind(enum.StrEnum):
    DPO = "dpo"  # Diffusion-DPO (Wallace et al. 2023) in velocity-error form
    STPO = "stpo"  # ours: DPO + a hinge on the winner's error + a cap on the loser's


class TimeWeight(enum.StrEnum):
    UNIFORM = "uniform"  # w(t) = 1
    EPSILON = "epsilon"  # w(t) = (1 - t)^2: the velocity error as a noise-prediction error


@dataclass(frozen=True)
class PreferenceConfig:
    """The preference objective (docs/rl.md writes the formulas out).

    ``beta``: DPO's inverse temperature, in units of the per-pixel mean squared velocity
    error. ``winner_hinge`` (STPO, λ_w): weight of β·w(t)·relu(e_w - e_ref_w), the price of
    the winner's error rising above the reference's. ``loser_cap`` (STPO, λ_l) and
    ``loser_margin`` (m): weight of β·w(t)·relu(e_l - e_ref_l - m), so the loser's error
    cannot run away either. ``flow_weight`` (γ): a plain flow-matching term on the winner.
    The STPO terms are ignored for ``dpo``.
    """

    kind: PreferenceKind = PreferenceKind.STPO
    beta: float = 5000.0
    time_weight: TimeWeight = TimeWeight.UNIFORM
    winner_hinge: float = 1.0
    loser_cap: float = 0.1
    loser_margin: float = 0.01
    flow_weight: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", PreferenceKind(self.kind))
        object.__setattr__(self, "time_weight", TimeWeight(self.time_weight))
        if self.beta <= 0:
            raise ValueError(f"preference beta={self.beta} must be positive")
        for name in ("winner_hinge", "loser_cap", "loser_margin", "flow_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"preference {name}={getattr(self, name)} must be >= 0")


@dataclass
class PairTerms:
    """Per-pair pieces of one preference step (all [P] float32; ``loss`` keeps its graph)."""

    loss: Tensor
    winner_gap: Tensor  # e_w - e_ref_w: above 0, the winner's likelihood fell
    loser_gap: Tensor  # e_l - e_ref_l
    margin: Tensor  # β·w(t)·[(e_l - e_ref_l) - (e_w - e_ref_w)], DPO's logit
    winner_error: Tensor  # e_w, the policy's flow error on the winner


def time_weight(kind: TimeWeight, t: Tensor) -> Tensor:
    """w(t) [P] for flow times ``t`` [P] (1 = noise). With x_t = (1-t)x + t·ε and
    v = ε - x, the noise the model implies is ε̂ = x_t + (1-t)·v̂, so ||ε̂ - ε||² =
    (1-t)²·||v̂ - v||²: ``epsilon`` is Diffusion-DPO's ε-error form exactly."""
    if TimeWeight(kind) is TimeWeight.EPSILON:
        return (1 - t.float()).square()
    return torch.ones_like(t, dtype=torch.float32)


def pair_terms(
    cfg: PreferenceConfig,
    e_w: Tensor,
    e_l: Tensor,
    e_ref_w: Tensor,
    e_ref_l: Tensor,
    t: Tensor,
) -> PairTerms:
    """The per-pair loss of ``cfg`` from velocity errors [P] (per-pixel means of
    ||v_θ(x_t) - v*||² for winner and loser at a shared t and noise, and the frozen
    reference's, which carry no gradient) at flow times ``t`` [P]."""
    w = time_weight(cfg.time_weight, t).to(e_w.device)
    gap_w = e_w.float() - e_ref_w.float().detach()
    gap_l = e_l.float() - e_ref_l.float().detach()
    margin = cfg.beta * w * (gap_l - gap_w)
    loss = F.softplus(-margin)  # -log σ(margin)
    if cfg.kind is PreferenceKind.STPO:
        loss = loss + cfg.beta * w * cfg.winner_hinge * F.relu(gap_w)
        loss = loss + cfg.beta * w * cfg.loser_cap * F.relu(gap_l - cfg.loser_margin)
    if cfg.flow_weight:
        loss = loss + cfg.flow_weight * e_w.float()
    return PairTerms(loss, gap_w.detach(), gap_l.detach(), margin.detach(), e_w.detach().float())
