"""What a ``style`` stage's ``settings`` table says, and the module it builds.

Kept apart from the objective (:mod:`krea2.trainer.style_ref`) so that building a stage's
module needs neither the step nor the objective registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from krea2.trainer.style_transforms import ReferenceMode

if TYPE_CHECKING:
    from krea2.trainer.config import StageConfig

STYLE_OBJECTIVE = "style"  # the objective's registered name


@dataclass(frozen=True)
class StyleSettings:
    """A ``style`` stage's ``settings`` table.

    ``reference``: what the module sees as the reference of a training image
    (:class:`~krea2.trainer.style_transforms.ReferenceMode`). ``tiles``: the shuffle grid
    (the image side must divide into it). ``tokens``: pooled tokens per reference;
    ``max_refs``: references at once at sampling (slot embeddings); ``heads``: the
    pooling's attention heads. ``strength``: the range each training reference's strength
    s is drawn from (log s is its attention bias); (1, 1) trains at the nominal strength
    only. ``drop``: share of rows trained with no reference (s = 0), which keeps the
    module's tokens from carrying what the base does anyway. ``pool`` and ``cross``: the
    module's spatial path (:class:`krea2.dit.StyleConfig`; "attention" and 0: none)."""

    reference: ReferenceMode = ReferenceMode.INPAINT_SHUFFLE
    tiles: int = 4
    tokens: int = 4
    max_refs: int = 4
    heads: int = 4
    strength: tuple[float, float] = (1.0, 1.0)
    drop: float = 0.0
    cross: int = 0
    pool: str = "attention"

    def __post_init__(self) -> None:
        object.__setattr__(self, "reference", ReferenceMode(self.reference))
        lo, hi = (float(v) for v in self.strength)
        if not 0.0 < lo <= hi:
            raise ValueError(f"strength = {list(self.strength)} must be 0 < low <= high")
        object.__setattr__(self, "strength", (lo, hi))
        if self.tiles < 1 or self.tokens < 1 or self.max_refs < 1 or self.heads < 1:
            raise ValueError("tiles, tokens, max_refs and heads must be positive")
        if not 0.0 <= self.drop < 1.0:
            raise ValueError(f"drop = {self.drop} must be in [0, 1)")
        from krea2.dit import STYLE_POOLS

        if self.pool not in STYLE_POOLS:
            raise ValueError(f"pool = {self.pool!r} must be one of {list(STYLE_POOLS)}")
        if self.cross < 0:
            raise ValueError(f"cross = {self.cross} must be >= 0 (0: no spatial path)")


def style_settings_of(stage: StageConfig) -> StyleSettings | None:
    """The stage's :class:`StyleSettings` when it trains a style module, else None."""
    if stage.objective != STYLE_OBJECTIVE:
        return None
    from krea2.trainer.objectives import stage_settings

    return stage_settings(stage)


def trains_style_only(stage: StageConfig) -> bool:
    """Whether the stage trains a style module alone on a frozen base: a style stage (a
    new module) or a stage that continues an earlier one's (``style_from``)."""
    return stage.objective == STYLE_OBJECTIVE or bool(stage.style_from)


def style_origin(stages: list[StageConfig], index: int) -> StageConfig | None:
    """The style stage whose module stage ``index`` of ``stages`` trains: itself, or the
    stage its ``style_from`` names, followed back; None when it trains none. ValueError
    when ``style_from`` names no earlier stage that trains a style module."""
    stage = stages[index]
    while stage.style_from:
        earlier = [s.name for s in stages[:index]]
        if stage.style_from not in earlier:
            raise ValueError(
                f"stage {stage.name!r}: style_from={stage.style_from!r} is not an earlier "
                f"stage (earlier: {earlier})"
            )
        index = earlier.index(stage.style_from)
        if not trains_style_only(stages[index]):
            raise ValueError(
                f"stage {stage.name!r}: style_from={stage.style_from!r} names a stage that "
                f"trains no style module (objective {stages[index].objective!r})"
            )
        stage = stages[index]
    return stage if stage.objective == STYLE_OBJECTIVE else None


def stage_style_path(run_dir: str | Path, stage: str) -> Path:
    """Where the finished style stage ``stage`` of the run in ``run_dir`` keeps its module."""
    return Path(run_dir) / "style" / stage / "style.safetensors"


def continued_style_module(run_dir: Any, stage: StageConfig, dit_cfg: Any) -> torch.nn.Module:
    """The module that stage ``style_from`` of the run in ``run_dir`` wrote when it
    finished, in float32 and trainable: the start of a stage that continues it. UserError
    when that stage has not finished."""
    from krea2.dit import load_style_module
    from krea2.infra.errors import UserError

    path = stage_style_path(run_dir, stage.style_from)
    if not path.is_file():
        raise UserError(
            f"stage {stage.name!r} continues the style module of stage {stage.style_from!r}, "
            f"which has written none at {path}: train that stage first"
        )
    module = load_style_module(path, dit_cfg, dtype=torch.float32)
    return module.train().requires_grad_(True)


def build_style_module(settings: StyleSettings, dit_cfg: Any, seed: int) -> torch.nn.Module:
    """A fresh style module for a DiT of config ``dit_cfg``, seeded (every rank and layout
    builds the same weights; the global RNG is restored after)."""
    from krea2.dit import StyleConfig, StyleModule

    cfg = StyleConfig.for_dit(
        dit_cfg,
        tokens=settings.tokens,
        max_refs=settings.max_refs,
        heads=settings.heads,
        cross=settings.cross,
        pool=settings.pool,
    )
    cfg.check_matches(dit_cfg, "the style settings")  # a cross past the DiT's blocks
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 7919)
        return StyleModule(cfg)


__all__ = [
    "STYLE_OBJECTIVE",
    "StyleSettings",
    "build_style_module",
    "continued_style_module",
    "stage_style_path",
    "style_origin",
    "style_settings_of",
    "trains_style_only",
]
