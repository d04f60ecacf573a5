"""krea2.rl's objectives as trainer stages: ``dpo``, ``stpo``, ``grpo`` and ``nft``.

Registered in ``krea2.objectives`` (this package's ``pyproject.toml``), so a job's
``[[stages]]`` may name them and ``krea2 train --config`` runs them on the trainer's loop
without the trainer importing ``krea2.rl``. A stage's ``[stages.settings]`` table is the
objective's own config: :class:`~krea2.rl.preference.loss.PreferenceConfig` for ``dpo``
and ``stpo`` (pair shards: ``krea2 rl export-pairs``), :class:`~krea2.rl.online.GrpoConfig`
for ``grpo`` and ``nft`` (prompt shards: ``krea2.rl.online.export_prompt_shards``; the
rewards are specs of :func:`krea2.rl.rewards.load_reward`)::

    [[stages]]
    name = "po"
    objective = "stpo"
    data = ["pairs/*.parquet"]
    caption_weights = { medium = 1.0 }
    caption_dropout = 0.0
    [stages.settings]
    beta = 5000.0
"""

from __future__ import annotations

from typing import Any

from krea2.rl.online.config import GrpoConfig
from krea2.rl.preference.loss import PreferenceConfig
from krea2.trainer.objectives import ObjectiveSpec

__all__ = ["DPO", "GRPO", "NFT", "STPO"]


def _preference(settings: PreferenceConfig, stage: Any, job: Any) -> Any:
    from krea2.rl.preference.objective import PreferenceObjective

    return PreferenceObjective(settings)


def _pairs(stage: Any, where: str, dp: int) -> None:
    from krea2.rl.preference.train import check_pair_stage

    check_pair_stage(stage, where, dp)


def _online(settings: GrpoConfig, stage: Any, job: Any) -> Any:
    from krea2.rl.online.objective import GrpoObjective
    from krea2.rl.online.train import load_rewards

    return GrpoObjective(settings, load_rewards(settings))


DPO = ObjectiveSpec(
    name="dpo",
    summary="Diffusion-DPO on (winner, loser) pair shards against the frozen start",
    settings=PreferenceConfig,
    build=_preference,
    rows="pairs",
    judges_spikes=False,
    fixed={"kind": "dpo"},
    check=_pairs,
)
STPO = ObjectiveSpec(
    name="stpo",
    summary="STPO: DPO with a hinge on the winner's error and a cap on the loser's",
    settings=PreferenceConfig,
    build=_preference,
    rows="pairs",
    judges_spikes=False,
    fixed={"kind": "stpo"},
    check=_pairs,
)
GRPO = ObjectiveSpec(
    name="grpo",
    summary="GRPO on SDE rollouts without CFG, rewards by spec, on prompt shards",
    settings=GrpoConfig,
    build=_online,
    rows="prompts",
    judges_spikes=False,
    fixed={"objective": "grpo"},
)
NFT = ObjectiveSpec(
    name="nft",
    summary="DiffusionNFT on the same rollouts (forward-process negative-aware fine-tuning)",
    settings=GrpoConfig,
    build=_online,
    rows="prompts",
    judges_spikes=False,
    fixed={"objective": "nft"},
)
