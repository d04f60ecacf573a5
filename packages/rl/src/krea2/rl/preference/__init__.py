"""krea2.rl.preference: preference pairs and preference optimization (Diffusion-DPO, STPO)
on a flow-matching DiT, trained on ``krea2.trainer``'s loop (see docs/rl.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.rl.preference import cli as cli
    from krea2.rl.preference.annotate import AnnotationSession as AnnotationSession
    from krea2.rl.preference.annotate import annotate_app as annotate_app
    from krea2.rl.preference.annotate import left_role as left_role
    from krea2.rl.preference.loss import PairTerms as PairTerms
    from krea2.rl.preference.loss import PreferenceConfig as PreferenceConfig
    from krea2.rl.preference.loss import PreferenceKind as PreferenceKind
    from krea2.rl.preference.loss import TimeWeight as TimeWeight
    from krea2.rl.preference.loss import pair_terms as pair_terms
    from krea2.rl.preference.loss import time_weight as time_weight
    from krea2.rl.preference.measures import SmoothnessReward as SmoothnessReward
    from krea2.rl.preference.measures import high_frequency_energy as high_frequency_energy
    from krea2.rl.preference.measures import high_frequency_shares as high_frequency_shares
    from krea2.rl.preference.objective import PreferenceObjective as PreferenceObjective
    from krea2.rl.preference.onpolicy import generate_pairs as generate_pairs
    from krea2.rl.preference.onpolicy import rank_pairs as rank_pairs
    from krea2.rl.preference.shards import Pair as Pair
    from krea2.rl.preference.shards import export_pair_shards as export_pair_shards
    from krea2.rl.preference.shards import read_pairs_file as read_pairs_file
    from krea2.rl.preference.shards import write_pairs_file as write_pairs_file
    from krea2.rl.preference.stage import PreferenceStageSettings as PreferenceStageSettings
    from krea2.rl.preference.stage import preference_stage as preference_stage
    from krea2.rl.preference.stage import shapes_preference_reward as shapes_preference_reward
    from krea2.rl.preference.stage_job import preference_job as preference_job
    from krea2.rl.preference.table import PAIRS_TABLE as PAIRS_TABLE
    from krea2.rl.preference.table import missing_images as missing_images
    from krea2.rl.preference.table import open_pairs as open_pairs
    from krea2.rl.preference.table import pairs_table as pairs_table
    from krea2.rl.preference.table import read_pairs as read_pairs
    from krea2.rl.preference.table import set_choice as set_choice
    from krea2.rl.preference.table import write_pairs as write_pairs
    from krea2.rl.preference.train import check_preference_job as check_preference_job
    from krea2.rl.preference.train import train_preference as train_preference

_HOMES: dict[str, str | None] = {
    # the objective
    "PreferenceConfig": "loss",
    "PreferenceKind": "loss",
    "TimeWeight": "loss",
    "PairTerms": "loss",
    "pair_terms": "loss",
    "time_weight": "loss",
    "PreferenceObjective": "objective",
    # training
    "train_preference": "train",
    "check_preference_job": "train",
    # pairs on disk
    "Pair": "shards",
    "export_pair_shards": "shards",
    "read_pairs_file": "shards",
    "write_pairs_file": "shards",
    # on-policy pairs and drift
    "generate_pairs": "onpolicy",
    "rank_pairs": "onpolicy",
    "high_frequency_energy": "measures",
    "high_frequency_shares": "measures",
    "SmoothnessReward": "measures",
    # pairs in a krablet table
    "PAIRS_TABLE": "table",
    "pairs_table": "table",
    "open_pairs": "table",
    "write_pairs": "table",
    "read_pairs": "table",
    "set_choice": "table",
    "missing_images": "table",
    # annotation
    "annotate_app": "annotate",
    "left_role": "annotate",
    "AnnotationSession": "annotate",
    # the demo's preference stage
    "PreferenceStageSettings": "stage",
    "preference_stage": "stage",
    "shapes_preference_reward": "stage",
    "preference_job": "stage_job",
    "cli": None,
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
