"""The demo's typed recipe: the pool, the evaluation and the trainer's own job config.

The recipes ship inside the package (``krea2/pipeline/recipes/demo.toml``; ``--quick``
reads ``demo-quick.toml``), so ``pip install krea2 && krea2 demo`` works outside a
checkout. ``[train]`` is a :class:`krea2.trainer.JobConfig` exactly as ``krea2 train
--config`` reads it; the demo fills in only what depends on its run: ``run_dir``, each
stage's ``data`` (the shards it exports) and ``observe.sample_prompts`` (held-out prompts).
``[preference]`` is a :class:`krea2.rl.preference.PreferenceStageSettings`; its sampling
(``sample_steps``, ``sample_cfg``, ``eval_seeds``) is ``[eval]``'s, filled in here.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from importlib.resources import abc as resources_abc
from pathlib import Path

from krea2.expander import ExpanderStageSettings
from krea2.infra import ConfigError, UserError, load_config
from krea2.rl.distill import TdmConfig
from krea2.rl.online import RlStageSettings
from krea2.rl.preference import PreferenceConfig, PreferenceStageSettings
from krea2.trainer import JobConfig, ReferenceMode, StyleSettings

RECIPES = ("demo.toml", "demo-quick.toml")
# The preference stage samples (pairs and its evaluation) as ShapesEval does: these
# [preference] fields are [eval]'s, so a recipe sets them there and only there.
FROM_EVAL = {"sample_steps": "steps", "sample_cfg": "cfg", "eval_seeds": "seeds"}


@dataclass
class PoolSpec:
    """The raw pool: one-object scenes of the training concepts plus the defect injector's
    multi-object scenes and defects (``krea2.curate.shapes.make_pool``)."""

    seed: int = 0
    per_concept: int = 6  # one-object scenes per training concept (dedup keeps ~1 in 2)
    rerenders: int = 1  # near-identical re-renders of each (dedup folds nearly all)
    side: int = 320  # px, one-object scenes are square (resized near duplicates stay ≥ 256)
    held_out_fraction: float = 0.15
    n_clean_multi: int = 100
    n_per_defect: int = 25
    n_overrepresented: int = 160  # ~20% of the kept pool (> the 15% cap, so the cap applies)
    # Copies of clean multi-object scenes that hashes miss (crops > 5%, tone and blur edits;
    # ``pool.DEMO_COPY_EDITS``), for embedding dedup; at most ``n_clean_multi``.
    n_copies: int = 0
    # Share of the one-object takes drawn on a gradient or texture background (named in
    # their captions) instead of black or dark grey: what a style reference can ask raw for.
    styled: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.styled <= 1:  # at load, not once the pool stage draws the scenes
            raise ValueError(f"styled={self.styled} must be a share in [0, 1]")


@dataclass
class RlPromptSpec:
    """How the RL stage words its training concepts' prompts. ``content_share``: the share
    of them (drawn per concept from ``seed``) given as the content prompt, colour, shape and
    position without the background clause ("A red circle in the top left."), the rest as
    the full medium caption ShapesEval asks with. Prompts that leave the background out are
    what the style stage (its reference supplies the style) and the expander's short
    requests ask raw for."""

    content_share: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.content_share <= 1:
            raise ValueError(f"content_share={self.content_share} must be a share in [0, 1]")


@dataclass
class CurateSpec:
    """Embedding-level curation in the demo: the toy encoder's training steps on the pool's
    hash keepers, the pixel check of its candidate copies (``semantic.verify``), the SAE's
    steps, and the share of kept rows balanced sampling draws. ``ladder_max_distance``:
    the crop ladder of hash dedup (``dedup.ladder_max_distance``; 0 turns it off)."""

    encoder_steps: int = 100
    verify: float = 0.95
    sae_steps: int = 400
    balance_share: float = 0.9
    ladder_max_distance: int = 0


@dataclass
class EvalSpec:
    """ShapesEval: held-out prompts × seeds, sampled with ``steps`` Euler steps and CFG."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 20
    cfg: float = 3.0
    max_prompts: int = 28


def _demo_tdm() -> TdmConfig:
    return TdmConfig(student_steps=4, teacher_guidance=4.0)


@dataclass
class TurboStageSettings:
    """How big the turbo stage is (a demo recipe's ``[turbo]`` table); the objective is
    ``tdm``, the library's :class:`~krea2.rl.distill.TdmConfig` (``[turbo.tdm]``; its
    ``mode = "dmd2"`` is the ablation), not a copy.

    Training: ``steps`` iterations of ``prompts_per_step`` prompts at ``lr`` drawn from up
    to ``max_train_prompts`` training-concept prompts, checkpoints every
    ``checkpoint_every`` steps. Evaluation: the student at each of ``eval_steps`` without
    CFG, the teacher at each with and without ``[eval]``'s CFG; the speed from
    ``speed_prompts`` prompts x 1 seed, each model's sampling timed alone."""

    steps: int = 200
    prompts_per_step: int = 8
    lr: float = 1e-5
    max_train_prompts: int = 64
    checkpoint_every: int = 50
    eval_steps: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    speed_prompts: int = 8
    tdm: TdmConfig = field(default_factory=_demo_tdm)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "max_train_prompts", "speed_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not self.eval_steps or min(self.eval_steps) < 1:
            raise ValueError(f"eval_steps={self.eval_steps} must be step counts >= 1")
        if self.tdm.student_steps not in self.eval_steps:
            raise ValueError(
                f"eval_steps={self.eval_steps} must hold the student's own step count "
                f"tdm.student_steps={self.tdm.student_steps}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be positive")


def _demo_style_module() -> StyleSettings:
    return StyleSettings(reference=ReferenceMode.INPAINT_SHUFFLE)


@dataclass
class StyleAlignSettings:
    """Preference alignment of variant S (``[style.align]``;
    :mod:`krea2.pipeline.style_align`): S samples ``samples`` images (seeds ``seed``..) for
    each of ``cases`` training prompt x fresh-style reference cases; pairs are ranked by
    style similarity − leakage with ShapesEval held (a winner leads by ``min_gap``), the
    style similarity being (1 − ``csd_weight``) x the rule-based one (background kind and
    colour) + ``csd_weight`` x the toy CSD's cosine with the reference, and trained for
    ``steps`` steps of ``batch_size`` images (half as many pairs) at ``lr`` by the
    preference objective ``preference`` (krea2.rl.preference.PreferenceConfig itself) on the
    module alone. The candidates are sampled with ``sample_steps`` Euler steps (0:
    ``[eval]``'s). ``steps = 0``: no alignment."""

    steps: int = 0
    cases: int = 256
    samples: int = 8
    sample_steps: int = 0
    seed: int = 3000
    min_gap: float = 0.1
    csd_weight: float = 0.0
    batch_size: int = 16
    lr: float = 3e-4
    preference: PreferenceConfig = field(default_factory=lambda: PreferenceConfig(beta=1000.0))

    def __post_init__(self) -> None:
        if self.steps < 0 or self.cases < 1 or self.samples < 2 or self.sample_steps < 0:
            raise ValueError(
                "align: steps must be >= 0, cases >= 1, samples >= 2 and sample_steps >= 0"
            )
        if self.batch_size < 2 or self.batch_size % 2:
            raise ValueError(f"align: batch_size={self.batch_size} must be even (whole pairs)")
        if not self.lr > 0 or self.min_gap < 0:
            raise ValueError("align: lr must be positive and min_gap >= 0")
        if not 0 <= self.csd_weight <= 1:
            raise ValueError(f"align: csd_weight={self.csd_weight} must be in [0, 1]")


@dataclass
class StyleStageSettings:
    """How big the style stage is (a demo recipe's ``[style]`` table); the objective is the
    trainer's ``style``, its settings :class:`~krea2.trainer.StyleSettings`
    (``[style.module]``), whose ``reference`` is variant S's (R and O are fixed:
    ``reconstruct`` and ``paired``).

    Training: each of ``variants`` (letters R, S, O) for ``steps`` steps of ``batch_size``
    of ``train_images`` styled one-object scenes at ``lr``, drawn from ``seed`` with
    ``object_styles``. Evaluation: ``eval_cases`` held-out prompt x reference cases at
    ``[eval]``'s seeds and steps; S's ``strengths`` sweep and its mixing at weights
    ``mix`` on the first ``sweep_seeds`` seeds; the toy CSD trained for ``csd_steps``.
    Captions: ``caption_weights`` over the rows' ``medium`` (colour, shape, position) and
    ``short`` (colour and shape) captions, dropped at ``caption_dropout``: as real captions
    leave things out, so a module that can copy the reference learns to. ``uncaptioned``:
    the share of training scenes holding one more object that no caption names."""

    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    train_images: int = 2048
    seed: int = 11
    object_styles: list[str] = field(default_factory=lambda: ["filled"])
    variants: list[str] = field(default_factory=lambda: ["R", "S", "O"])
    eval_cases: int = 24
    strengths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    mix: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    csd_steps: int = 250
    sweep_seeds: int = 3
    caption_weights: dict[str, float] = field(default_factory=lambda: {"medium": 0.5, "short": 0.5})
    caption_dropout: float = 0.2
    uncaptioned: float = 0.0
    module: StyleSettings = field(default_factory=_demo_style_module)
    align: StyleAlignSettings = field(default_factory=StyleAlignSettings)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "train_images", "eval_cases", "csd_steps",
                     "sweep_seeds"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not set(self.variants) <= {"R", "S", "O"} or not self.variants:
            raise ValueError(f"variants={self.variants} must be letters of R, S, O")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be positive")
        if not 0 <= self.uncaptioned <= 1:
            raise ValueError(f"uncaptioned={self.uncaptioned} must be in [0, 1]")
        if any(s < 0 for s in self.strengths) or any(not 0 <= a <= 1 for a in self.mix):
            raise ValueError("strengths must be >= 0 and mix weights in [0, 1]")


# What the full recipe reaches, said next to a smoke run's scores (README, docs/benchmarks.md).
FULL_DEMO_RESULT = (
    "the full demo (`krea2 demo`, 760 + 560 pretraining steps, 20-30 minutes on 2 cores) "
    "reaches ShapesEval 0.64-0.70 with CFG 3 after pretraining and 0.66-0.76 without CFG "
    "for raw, the chain's end (README), against 0.13 for the untrained model"
)


@dataclass
class DemoConfig:
    shards: int = 2
    workers: int = 2
    # A smoke run (--quick) checks that every stage runs and reports; it trains far too
    # few steps to learn, and its report says so instead of looking like a failure.
    smoke: bool = False
    pool: PoolSpec = field(default_factory=PoolSpec)
    curate: CurateSpec = field(default_factory=CurateSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    train: JobConfig = field(default_factory=JobConfig)
    # After pretraining: on-policy pairs, then STPO and (the ablation) DPO on them.
    preference: PreferenceStageSettings = field(default_factory=PreferenceStageSettings)
    # Last: RL without CFG (DiffusionNFT or GRPO) on curated training-concept prompts.
    rl: RlStageSettings = field(default_factory=RlStageSettings)
    rl_prompts: RlPromptSpec = field(default_factory=RlPromptSpec)
    # The prompt expander in front of the final DiT: SFT, then GDPO (± diversity reward).
    expander: ExpanderStageSettings = field(default_factory=ExpanderStageSettings)
    # After raw: TDM into a few-step student without CFG (Turbo).
    turbo: TurboStageSettings = field(default_factory=TurboStageSettings)
    # After raw: a style-reference module on it, trained three ways (R, S, O).
    style: StyleStageSettings = field(default_factory=StyleStageSettings)


def packaged_recipe(quick: bool) -> resources_abc.Traversable:
    """The recipe that ``krea2 demo [--quick]`` runs, inside the installed package."""
    return resources.files("krea2.pipeline").joinpath("recipes", RECIPES[1 if quick else 0])


def recipe_text(quick: bool) -> str:
    """The packaged recipe's TOML text (``krea2 demo --show-config``)."""
    return packaged_recipe(quick).read_text()


def load_demo_config(
    quick: bool, config: Path | None = None, overrides: list[str] | None = None
) -> DemoConfig:
    """``config`` if given, else the packaged recipe; ``overrides`` as ``--set key=value``
    (``train.stages.0.steps=500`` is the first training stage's step count). The
    preference stage's sampling fields are set from ``[eval]`` (:data:`FROM_EVAL`)."""
    overrides = list(overrides or [])
    if config is not None:
        if not config.is_file():
            raise UserError(
                f"demo config {config} not found; `krea2 demo --show-config` prints one"
            )
        cfg = load_config(DemoConfig, config, overrides)
        given = _preference_keys(config.read_text(), overrides)
    else:
        with resources.as_file(packaged_recipe(quick)) as path:
            cfg = load_config(DemoConfig, path, overrides)
            given = _preference_keys(path.read_text(), overrides)
    if len(cfg.train.stages) < 1:
        raise UserError("the demo recipe needs at least one [[train.stages]] table")
    if owned := sorted(given & set(FROM_EVAL)):
        k = owned[0]
        raise ConfigError(
            f"preference.{k} is the demo's eval.{FROM_EVAL[k]} (the preference stage samples "
            f"as ShapesEval does); set eval.{FROM_EVAL[k]} instead"
        )
    try:
        values = {name: copy.copy(getattr(cfg.eval, key)) for name, key in FROM_EVAL.items()}
        cfg.preference = replace(cfg.preference, **values)
    except ValueError as exc:  # PreferenceStageSettings' own checks, on [eval]'s values
        raise ConfigError(f"config section 'eval' (as the preference stage's): {exc}") from None
    return cfg


def _preference_keys(recipe: str, overrides: list[str]) -> set[str]:
    """The ``[preference]`` keys that a recipe's text or ``--set`` overrides name."""
    keys = set(tomllib.loads(recipe).get("preference", {}))
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        if key.startswith("preference."):
            keys.add(key.removeprefix("preference.").split(".")[0])
    return keys


def smoke_note(cfg: DemoConfig) -> str | None:
    """The warning a smoke run's report and summary carry, or None for a real run."""
    if not cfg.smoke:
        return None
    steps = sum(stage.steps for stage in cfg.train.stages)
    return (
        f"Smoke run: {steps} training steps in all are far too few for the model to learn, "
        "so its samples look like noise and its ShapesEval may fall below the untrained "
        "model's. It checks that every stage runs and reports; " + FULL_DEMO_RESULT + "."
    )


def training_job(
    cfg: DemoConfig, run_dir: Path, shard_dirs: list[Path], sample_prompts: list[str]
) -> JobConfig:
    """``cfg.train`` with the run's directory, each stage's exported shards and the
    held-out prompts it samples."""
    stages = [
        replace(stage, data=[f"{d}/shard-*.parquet"])
        for stage, d in zip(cfg.train.stages, shard_dirs, strict=True)
    ]
    observe = replace(cfg.train.observe, sample_prompts=list(sample_prompts))
    return replace(cfg.train, run_dir=run_dir, stages=stages, observe=observe)


def demo_training_job(cfg: DemoConfig, demo: Path) -> tuple[JobConfig, bool]:
    """The training job of the demo run in ``demo`` (its ``--out``) and whether its
    pretraining finished (the last stage's checkpoints are marked done): what the proofs
    in benchmarks/ start from."""
    dirs = [demo / "shards" / s.name for s in cfg.train.stages]
    job = training_job(cfg, demo / "run", dirs, [])
    return job, (demo / "run" / "checkpoints" / f"{job.stages[-1].name}.done").exists()
