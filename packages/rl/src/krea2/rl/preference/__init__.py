"""krea2.rl.preference: preference pairs and preference optimization (Diffusion-DPO, STPO)
on a flow-matching DiT, trained on ``krea2.trainer``'s loop (see docs/rl.md)."""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports

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
