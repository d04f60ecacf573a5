"""krea2.rl.online: multi-reward RL of a flow DiT without CFG: GRPO on SDE rollouts with
per-step log-probabilities, and DiffusionNFT on the same rollouts, on ``krea2.trainer``'s
loop (see docs/rl.md: the ODE→SDE derivation for t = 1-is-noise, the objectives, GDPO).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.rl.online import cli as cli
    from krea2.rl.online.advantage import Aggregation as Aggregation
    from krea2.rl.online.advantage import advantages as advantages
    from krea2.rl.online.advantage import gdpo_sum as gdpo_sum
    from krea2.rl.online.advantage import group_z as group_z
    from krea2.rl.online.config import GrpoConfig as GrpoConfig
    from krea2.rl.online.config import RlObjective as RlObjective
    from krea2.rl.online.guards import artifact_alarm as artifact_alarm
    from krea2.rl.online.guards import background_noise as background_noise
    from krea2.rl.online.guards import gate_rewards as gate_rewards
    from krea2.rl.online.guards import noise_alarm as noise_alarm
    from krea2.rl.online.loss import gaussian_kl as gaussian_kl
    from krea2.rl.online.loss import grpo_terms as grpo_terms
    from krea2.rl.online.loss import nft_terms as nft_terms
    from krea2.rl.online.loss import nft_terms_adaptive as nft_terms_adaptive
    from krea2.rl.online.loss import optimality as optimality
    from krea2.rl.online.objective import GrpoObjective as GrpoObjective
    from krea2.rl.online.old_policy import OldPolicy as OldPolicy
    from krea2.rl.online.pool import PromptRecord as PromptRecord
    from krea2.rl.online.pool import curate_pool as curate_pool
    from krea2.rl.online.pool import pool_statistics as pool_statistics
    from krea2.rl.online.pool import reason_counts as reason_counts
    from krea2.rl.online.pool import training_pool as training_pool
    from krea2.rl.online.prompts import export_prompt_shards as export_prompt_shards
    from krea2.rl.online.sde import Rollout as Rollout
    from krea2.rl.online.sde import log_prob as log_prob
    from krea2.rl.online.sde import sde_rollout as sde_rollout
    from krea2.rl.online.sde import sigma_at as sigma_at
    from krea2.rl.online.sde import step_log_prob as step_log_prob
    from krea2.rl.online.sde import transition as transition
    from krea2.rl.online.sde import window_sigmas as window_sigmas
    from krea2.rl.online.stage import RlStageSettings as RlStageSettings
    from krea2.rl.online.stage import demo_objective as demo_objective
    from krea2.rl.online.stage import rl_stage as rl_stage
    from krea2.rl.online.stage import settings_with as settings_with
    from krea2.rl.online.train import RlRunConfig as RlRunConfig
    from krea2.rl.online.train import rl_job as rl_job
    from krea2.rl.online.train import run_from_config as run_from_config
    from krea2.rl.online.train import train_rl as train_rl
    from krea2.rl.online.world_rewards import shapes_rewards as shapes_rewards

_HOMES: dict[str, str | None] = {
    # rollouts
    "Rollout": "sde",
    "sde_rollout": "sde",
    "step_log_prob": "sde",
    "transition": "sde",
    "log_prob": "sde",
    "sigma_at": "sde",
    "window_sigmas": "sde",
    # advantages and losses
    "Aggregation": "advantage",
    "advantages": "advantage",
    "group_z": "advantage",
    "gdpo_sum": "advantage",
    "grpo_terms": "loss",
    "gaussian_kl": "loss",
    "nft_terms": "loss",
    "nft_terms_adaptive": "loss",
    "optimality": "loss",
    "OldPolicy": "old_policy",
    # pool curation and guards
    "PromptRecord": "pool",
    "curate_pool": "pool",
    "training_pool": "pool",
    "reason_counts": "pool",
    "pool_statistics": "pool",
    "gate_rewards": "guards",
    "artifact_alarm": "guards",
    "background_noise": "guards",
    "noise_alarm": "guards",
    # training
    "GrpoConfig": "config",
    "RlObjective": "config",
    "GrpoObjective": "objective",
    "export_prompt_shards": "prompts",
    "RlRunConfig": "train",
    "rl_job": "train",
    "train_rl": "train",
    "run_from_config": "train",
    # the demo's RL stage
    "RlStageSettings": "stage",
    "demo_objective": "stage",
    "settings_with": "stage",
    "rl_stage": "stage",
    "shapes_rewards": "world_rewards",
    "cli": None,
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
