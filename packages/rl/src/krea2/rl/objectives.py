"""krea2.rl's objectives as trainer stages: ``dpo``, ``stpo``, ``grpo``, ``nft``, ``tdm``
and ``dmd2``.

Registered in ``krea2.objectives`` (this package's ``pyproject.toml``), so a job's
``[[stages]]`` may name them and ``krea2 train --config`` runs them on the trainer's loop
without the trainer importing ``krea2.rl``. A stage's ``[stages.settings]`` table is the
objective's own config: :class:`~krea2.rl.preference.loss.PreferenceConfig` for ``dpo``
and ``stpo`` (pair shards: ``krea2 rl export-pairs``), :class:`~krea2.rl.online.GrpoConfig`
for ``grpo`` and ``nft`` (prompt shards: ``krea2.rl.online.export_prompt_shards``; the
rewards are specs of :func:`krea2.rl.rewards.load_reward`), :class:`~krea2.rl.distill.TdmConfig`
for ``tdm`` and ``dmd2`` (distillation of the stage's start into a few-step student, data-free
on prompt shards)::

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

from krea2.rl.distill.config import TdmConfig
from krea2.rl.online.config import GrpoConfig
from krea2.rl.preference.loss import PreferenceConfig
from krea2.trainer.objectives import ObjectiveSpec

__all__ = ["DMD2", "DPO", "GRPO", "NFT", "STPO", "TDM"]


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


def _distill(settings: TdmConfig, stage: Any, job: Any) -> Any:
    from krea2.rl.distill.objective import TdmObjective

    return TdmObjective(settings, job)


def _distill_stage(stage: Any, where: str, dp: int) -> None:
    from krea2.rl.distill.stage import check_distill_stage

    check_distill_stage(stage, where, dp)


def _distill_adapters(settings: TdmConfig, stage: Any) -> dict[str, Any]:
    """A LoRA student's fake score: a second adapter on its targets (``fake = "adapter"``)."""
    from dataclasses import replace

    from krea2.rl.distill.config import FakeScoreKind
    from krea2.rl.distill.fake_score import FAKE_ADAPTER

    if settings.fake is not FakeScoreKind.ADAPTER:
        return {}
    return {
        FAKE_ADAPTER: replace(stage.lora, rank=settings.fake_lora_rank, alpha=None, dropout=0.0)
    }


def _distilled_sampling(settings: TdmConfig) -> dict[str, Any]:
    """A distilled student samples on its own K-step grid without CFG."""
    return {"steps": settings.student_steps, "cfg": 0.0}


def _distill_spec(mode: str, summary: str) -> ObjectiveSpec:
    """``TdmConfig`` with ``mode`` fixed, on prompt shards (data-free); its model samples
    in ``student_steps`` steps without CFG."""
    return ObjectiveSpec(mode, summary, TdmConfig, _distill, rows="prompts",
                         judges_spikes=False, fixed={"mode": mode},
                         check=_distill_stage, sampling=_distilled_sampling,
                         adapters=_distill_adapters)  # fmt: skip


TDM = _distill_spec(
    "tdm", "TDM (Turbo): few-step student matched to the CFG teacher at every step's interval"
)
DMD2 = _distill_spec(
    "dmd2", "DMD2 ablation: one fake score over all times, two-time-scale fake updates"
)
