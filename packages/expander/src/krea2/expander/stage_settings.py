"""Settings of the expander stage (`krea2.expander.stage`), light to import: a recipe that
names them is read without loading trl or torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from krea2.expander.toy_model import ToyModelConfig
from krea2.expander.user_prompts import UserPromptConfig

__all__ = ["ExpanderStageSettings"]


@dataclass(frozen=True)
class ExpanderStageSettings:
    """The expander stage (`krea2 demo`'s ``[expander]``).

    SFT: ``requests_per_scene`` synthetic requests per training scene (each a different
    draw), answers in the ``target`` caption format, a toy Qwen3 sized by ``toy``.
    GDPO: ``gdpo_steps`` steps of ``gdpo_prompts`` requests × ``group`` expansions, each
    rendered by the DiT with ``render_steps`` Euler steps and ``render_cfg``; reward weights
    faithfulness 1, rubric 1, diversity ``diversity_weight`` and, when ``artifact_weight`` > 0,
    the artifact reward (its head calibrated on the DiT's own renders, `krea2.rl.online.
    shapes_rewards`) with that weight. ``ablate_diversity`` also trains
    a second GDPO run with the diversity weight at 0 (its reward is still logged).
    Evaluation: ``requests_per_concept`` requests per held-out scene, sampled as ShapesEval
    (``eval_steps``, ``eval_cfg``, ``eval_seeds``, filled in by the demo from ``[eval]``).
    """

    requests_per_scene: int = 2
    max_scenes: int = 2000
    target: str = "medium"
    sft_steps: int = 600
    sft_batch: int = 16
    sft_lr: float = 3e-3
    toy: ToyModelConfig = field(default_factory=ToyModelConfig)
    gdpo_steps: int = 30
    gdpo_prompts: int = 4
    group: int = 4
    gdpo_lr: float = 1e-4
    temperature: float = 1.0
    diversity_weight: float = 1.0
    artifact_weight: float = 0.0
    ablate_diversity: bool = True
    render_steps: int = 8
    render_cfg: float = 3.0
    requests_per_concept: int = 2
    max_new_tokens: int = 96
    eval_steps: int = 20
    eval_cfg: float = 3.0
    eval_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests_per_scene < 1 or self.requests_per_concept < 1 or self.max_scenes < 1:
            raise ValueError(f"{self}: requests and scenes must be at least 1")
        if self.group < 2:
            raise ValueError("group must be >= 2: GDPO and diversity compare a group")
        if self.gdpo_steps < 0 or self.sft_steps < 1:
            raise ValueError("sft_steps >= 1 and gdpo_steps >= 0 (0 skips GDPO)")
        if not self.eval_seeds:
            raise ValueError("eval_seeds must name at least one seed")
        UserPromptConfig(target=self.target)  # validates the format
