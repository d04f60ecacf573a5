"""The RL settings: ``[grpo]`` of a ``krea2 rl grpo`` config (TOML + ``--set``).

A run's config file holds the trainer job the RL stage belongs to (``job``, a trainer TOML
whose last stage is the RL stage, or built by the demo) and this table. Units: steps are
Euler steps of the sampling grid, ``noise_level`` is Flow-GRPO's ``a`` in
σ_t = a √(t / (1 - t)), ``clip`` is the ratio's clip range ε (ratios of per-element mean
log-probabilities, so ε is small), ``kl_beta`` weighs KL(π_θ ‖ π_ref) per element (GRPO)
or the squared velocity distance to the reference per element (DiffusionNFT).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from krea2.rl.online.advantage import Aggregation

NFT_WEIGHTINGS = ("velocity", "adaptive")


class RlObjective(StrEnum):
    GRPO = "grpo"
    NFT = "nft"


@dataclass
class GrpoConfig:
    """One RL stage's objective and rollouts (see docs/rl.md for each knob's effect).

    Rollouts: every prompt of a step's batch gets ``group_size`` images, sampled without
    CFG in ``sample_steps`` Euler steps of the stage's time grid; ``window_size`` of those
    steps are stochastic (the SDE), starting at a step drawn each iteration from
    0..``window_start_max`` (the rest deterministic); ``shared_noise`` gives a group one
    initial noise (its spread then comes from the window alone). ``micro_batch`` images go
    through one forward, in the rollout and again in training (the same rows, so the first
    inner step's ratio is exactly 1).

    Rewards: ``rewards`` name → reward spec (``krea2.rl.rewards.load_reward``; the demo
    passes in-process rewards), ``weights`` name → weight, aggregated by ``aggregation``
    (``normalize_then_sum``: GDPO; or ``sum_then_normalize``). Guards: with
    ``artifact_gate`` set, an image whose ``artifact`` reward is below it gets every other
    reward set to that reward's group minimum (no gain from a defective image);
    ``artifact_bound`` (0..1): the run stops when the held-out artifact reward falls below
    (1 - artifact_bound) x its value at the start; ``noise_bound`` (> 1): the run stops when
    the held-out background noise (:func:`krea2.rl.online.guards.background_noise`, an
    evaluation's ``bg_noise``) rises above noise_bound x its value at the start.

    Objective ``grpo``: ``inner_steps`` optimizer steps per rollout batch (its images split
    in that many minibatches), ratio clip ``clip``, ``kl_beta``. Objective ``nft``
    (DiffusionNFT): ``nft_beta``, ``nft_times`` forward-process times per image,
    ``nft_old_decay``: the sampling policy that rolls out and gives v_old is an EMA of the
    trained weights with this decay per iteration (0: the current weights;
    :mod:`krea2.rl.online.old_policy`), ``nft_weighting``: ``velocity`` (the squared velocity
    error) or ``adaptive`` (DiffusionNFT's: the clean-sample error normalised per sample,
    :func:`krea2.rl.online.loss.nft_terms_adaptive`), and
    ``kl_beta`` x ‖v_θ - v_ref‖² (element mean, at the same noisy points) to the
    reference. With ``kl_beta`` > 0 the trainer keeps a frozen reference (the pre-RL
    weights)."""

    objective: RlObjective = RlObjective.GRPO
    group_size: int = 8
    shared_noise: bool = False
    sample_steps: int = 10
    noise_level: float = 0.7
    window_size: int = 2
    window_start_max: int = 3
    micro_batch: int = 32
    rewards: dict[str, str] = field(default_factory=lambda: {"rubric": "rubric"})
    weights: dict[str, float] = field(default_factory=lambda: {"rubric": 1.0})
    aggregation: Aggregation = Aggregation.NORMALIZE_THEN_SUM
    artifact_gate: float | None = None
    artifact_bound: float | None = None
    noise_bound: float | None = None
    inner_steps: int = 1
    clip: float = 0.01
    kl_beta: float = 0.0
    nft_beta: float = 1.0
    nft_times: int = 1
    nft_old_decay: float = 0.0
    nft_weighting: str = "velocity"
    adv_clip: float = 5.0

    def __post_init__(self) -> None:
        self.objective = RlObjective(self.objective)
        self.aggregation = Aggregation(self.aggregation)
        for name in ("group_size", "sample_steps", "micro_batch", "inner_steps", "nft_times"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size}: a group needs 2 images to compare")
        if self.objective is RlObjective.GRPO:
            if not 1 <= self.window_size <= self.sample_steps:
                raise ValueError(
                    f"window_size={self.window_size} must be in 1..sample_steps="
                    f"{self.sample_steps} (GRPO needs stochastic steps)"
                )
            if self.noise_level <= 0:
                raise ValueError(f"noise_level={self.noise_level} must be > 0 for GRPO")
        if not 0 <= self.window_start_max <= self.sample_steps - max(self.window_size, 0):
            raise ValueError(
                f"window_start_max={self.window_start_max} must be in 0..sample_steps - "
                f"window_size = {self.sample_steps - self.window_size}"
            )
        if set(self.weights) != set(self.rewards):
            raise ValueError(
                f"weights {sorted(self.weights)} must name the same rewards as rewards "
                f"{sorted(self.rewards)}"
            )
        if (self.artifact_gate is not None or self.artifact_bound is not None) and (
            "artifact" not in self.rewards
        ):
            raise ValueError("artifact_gate/artifact_bound need a reward named 'artifact'")
        if self.artifact_bound is not None and not 0 < self.artifact_bound < 1:
            raise ValueError(f"artifact_bound={self.artifact_bound} must be in (0, 1)")
        if self.noise_bound is not None and not self.noise_bound > 1:
            raise ValueError(f"noise_bound={self.noise_bound} must be > 1 (a growth factor)")
        if not 0 <= self.nft_old_decay < 1:
            raise ValueError(f"nft_old_decay={self.nft_old_decay} must be in [0, 1)")
        if self.nft_weighting not in NFT_WEIGHTINGS:
            raise ValueError(
                f"nft_weighting={self.nft_weighting!r} is not one of {', '.join(NFT_WEIGHTINGS)}"
            )
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta={self.kl_beta} must be >= 0")
        if not 0 < self.clip < 1:
            raise ValueError(f"clip={self.clip} must be in (0, 1)")
