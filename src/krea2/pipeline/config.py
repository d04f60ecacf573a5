"""The demo's typed config (``configs/toy/demo.toml``; ``--quick`` applies ``demo-quick.toml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs" / "toy"


@dataclass
class PoolSpec:
    """The raw pool: one-object scenes of the training concepts plus the defect injector's
    multi-object scenes and defects (``krea2.curate.shapes.defects.make_pool``)."""

    seed: int = 0
    per_concept: int = 6  # one-object scenes per training concept (dedup keeps ~1 in 2)
    rerenders: int = 1  # near-identical re-renders of each (dedup folds nearly all)
    side: int = 320  # px, one-object scenes are square (resized near duplicates stay ≥ 256)
    held_out_fraction: float = 0.15
    n_clean_multi: int = 100
    n_per_defect: int = 25
    n_overrepresented: int = 160  # ~20% of the kept pool (> the 15% cap, so the cap applies)


@dataclass
class StageSpec:
    """One pretraining resolution stage."""

    side: int = 32
    steps: int = 800
    batch_size: int = 64
    lr: float = 3e-3
    time_shift: float | None = None  # None: the resolution rule of krea2.dit.flow
    patch: int | None = None  # DiT patch (None: the model's); see StageConfig.patch


@dataclass
class EvalSpec:
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 20
    cfg: float = 3.0
    max_prompts: int = 28


@dataclass
class DemoConfig:
    shards: int = 2
    workers: int = 2
    pool: PoolSpec = field(default_factory=PoolSpec)
    low: StageSpec = field(default_factory=StageSpec)
    high: StageSpec = field(
        default_factory=lambda: StageSpec(side=64, steps=600, lr=2e-3, time_shift=1.17, patch=8)
    )
    eval: EvalSpec = field(default_factory=EvalSpec)
    model: str = "toy"
    model_overrides: dict[str, int | float | bool | str] = field(default_factory=dict)
    autocast: str = "auto"  # trainer ModelConfig.autocast: bf16 matmuls where the CPU has them
    prediction: str = "split"  # trainer ModelConfig.prediction (why: see there)
    text_tokens: int = 12  # words per caption the word conditioner reads (medium: 11-13)
    threads: int = 2


def load_demo_config(
    quick: bool, config: Path | None = None, overrides: list[str] | None = None
) -> DemoConfig:
    """``config`` if given, else ``configs/toy/demo[-quick].toml`` of the source checkout."""
    from krea2.infra.config import load_config
    from krea2.infra.errors import UserError

    path = config or CONFIG_DIR / ("demo-quick.toml" if quick else "demo.toml")
    if not path.is_file():
        raise UserError(f"demo config {path} not found; pass --config configs/toy/demo.toml")
    return load_config(DemoConfig, path, overrides or [])
