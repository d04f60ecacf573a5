"""krea2.rl.online: multi-reward RL of a flow DiT without CFG: GRPO on SDE rollouts with
per-step log-probabilities, and DiffusionNFT on the same rollouts, on ``krea2.trainer``'s
loop (see docs/rl.md: the ODE→SDE derivation for t = 1-is-noise, the objectives, GDPO).
"""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports

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
