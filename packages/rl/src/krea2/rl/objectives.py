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


def _preference_spec(kind: str, summary: str) -> ObjectiveSpec:
    """``PreferenceConfig`` with ``kind`` fixed, on (winner, loser) pair shards."""
    return ObjectiveSpec(kind, summary, PreferenceConfig, _preference, rows="pairs",
                         judges_spikes=False, fixed={"kind": kind}, check=_pairs)  # fmt: skip


def _online_spec(objective: str, summary: str) -> ObjectiveSpec:
    """``GrpoConfig`` with ``objective`` fixed, on prompt shards."""
    return ObjectiveSpec(objective, summary, GrpoConfig, _online, rows="prompts",
                         judges_spikes=False, fixed={"objective": objective})  # fmt: skip


DPO = _preference_spec(
    "dpo", "Diffusion-DPO on (winner, loser) pair shards against the frozen start"
)
STPO = _preference_spec(
    "stpo", "STPO: DPO with a hinge on the winner's error and a cap on the loser's"
)
GRPO = _online_spec("grpo", "GRPO on SDE rollouts without CFG, rewards by spec, on prompt shards")
NFT = _online_spec(
    "nft", "DiffusionNFT on the same rollouts (forward-process negative-aware fine-tuning)"
)
