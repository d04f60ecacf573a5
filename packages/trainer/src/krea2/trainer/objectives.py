"""Objectives by name: what a ``[[stages]]`` entry's ``objective`` may say.

The trainer owns ``flow`` (rectified flow matching: pretraining, midtraining, SFT). Other
objectives register through the ``krea2.objectives`` entry-point group, the way packages
add sub-commands to the CLI (``krea2.cli``), so the trainer never imports them; the
trainer's own ``style`` (a style-reference module on a frozen base,
:mod:`krea2.trainer.style_ref`) registers the same way::

    [project.entry-points."krea2.objectives"]
    stpo = "krea2.rl.objectives:STPO"

Each entry point names an :class:`ObjectiveSpec`. A stage's ``settings`` table is the
spec's own config type (e.g. ``krea2.rl``'s ``GrpoConfig``), built by the spec with the
same checks and error messages as any config section (``stages.3.settings.group_size``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any

from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.trainer.config import JobConfig, LoraConfig, StageConfig

Objective = Any  # krea2.trainer.step.Objective (not imported: step imports the model code)

__all__ = [
    "ENTRY_POINT_GROUP",
    "FLOW",
    "ObjectiveSpec",
    "build_objective",
    "check_stage_objective",
    "judges_spikes",
    "objective_adapters",
    "objective_spec",
    "registered_objectives",
    "stage_settings",
]

ENTRY_POINT_GROUP = "krea2.objectives"


@dataclass(frozen=True)
class ObjectiveSpec:
    """One trainable objective.

    ``settings``: the config dataclass a stage's ``settings`` table builds (None: the
    objective takes none; a non-empty table is then an error). ``build(settings, stage,
    job)``: the :class:`~krea2.trainer.step.Objective` for one stage (None: the trainer's
    own flow-matching step). ``rows``: what the stage's shards hold (``images``,
    ``pairs`` or ``prompts``), for messages and recipes. ``judges_spikes``: whether the
    spike guard judges this loss against its running statistics by default (a preference
    or RL loss falls or jumps by design; non-finite steps are dropped either way).
    ``fixed``: settings this name implies (``stpo`` is the preference objective with
    ``kind = "stpo"``); a stage that sets one of them otherwise is refused.
    ``check(stage, where, dp)``: what the objective needs of a stage beyond a trainer
    stage (e.g. whole pairs on every rank), a UserError naming ``where`` and the fix.
    ``sampling(settings)``: how the model it trains is meant to be sampled, when that is
    not the guided many-step default (a distilled student: ``{"steps": K, "cfg": 0.0}``);
    exports record it and the samplers take it as their defaults. ``adapters(settings,
    stage)``: LoRA adapters by peft name the objective trains itself on a LoRA stage's base
    beside the stage's own (TDM's fake score), built into the stage's module before
    sharding and left out of the stage's optimizer and exported adapter."""

    name: str
    summary: str
    settings: type | None
    build: Callable[[Any, StageConfig, JobConfig], Objective | None]
    rows: str = "images"
    judges_spikes: bool = True
    fixed: Mapping[str, Any] | None = None
    check: Callable[[StageConfig, str, int], None] | None = None
    sampling: Callable[[Any], Mapping[str, Any]] | None = None
    adapters: Callable[[Any, StageConfig], Mapping[str, LoraConfig]] | None = None


def _flow(settings: Any, stage: StageConfig, job: JobConfig) -> None:
    return None  # the trainer's own step (krea2.trainer.step.forward_backward)


FLOW = ObjectiveSpec(
    name="flow",
    summary="rectified flow matching on captioned images (pretraining, midtraining, SFT)",
    settings=None,
    build=_flow,
)


@cache
def registered_objectives() -> dict[str, ObjectiveSpec]:
    """Every objective a stage may name: the trainer's ``flow`` and the installed entry
    points' (the trainer's own ``style`` among them). An entry
    point that fails to load or is not a spec is a UserError naming its package."""
    found = {FLOW.name: FLOW}
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            spec = ep.load()
        except Exception as exc:  # a broken plugin must say which one it is
            raise UserError(f"objective {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
        if not isinstance(spec, ObjectiveSpec) or spec.name != ep.name:
            raise UserError(
                f"entry point {ep.name!r} ({ep.value}) is not ObjectiveSpec {ep.name!r}"
            )
        found.setdefault(ep.name, spec)
    return found


def objective_spec(name: str) -> ObjectiveSpec:
    """The spec registered as ``name``; UserError listing the known ones otherwise."""
    specs = registered_objectives()
    if name not in specs:
        import difflib

        close = difflib.get_close_matches(name, list(specs), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = "\n  ".join(f"{n}: {s.summary}" for n, s in specs.items())
        raise UserError(
            f"unknown objective {name!r}{hint}; installed objectives:\n  {known}\n"
            "(others come with their packages, e.g. krea2-rl for dpo, stpo, grpo, nft, tdm, dmd2)"
        )
    return specs[name]


def check_stage_objective(stage: StageConfig, index: int, dp: int) -> None:
    """The stage's objective exists, its settings build, and its own checks pass for
    ``dp`` data-parallel ranks; UserError (naming ``stages.INDEX``) otherwise."""
    stage_settings(stage, f"stages.{index}")
    spec = objective_spec(stage.objective)
    if spec.check is not None:
        spec.check(stage, f"stages.{index}", dp)


def stage_settings(stage: StageConfig, where: str = "") -> Any:
    """``stage.settings`` built into its objective's config type (None when the objective
    takes none); ConfigError naming the key (``where``: the stage's key prefix, e.g.
    ``stages.3``)."""
    from krea2.infra.config import ConfigError, build_config

    spec = objective_spec(stage.objective)
    prefix = f"{where}.settings" if where else f"stage {stage.name!r} settings"
    if spec.settings is None:
        if stage.settings:
            raise ConfigError(
                f"{prefix}: objective {spec.name!r} takes no settings, got {sorted(stage.settings)}"
            )
        return None
    data = dict(stage.settings)
    for key, value in (spec.fixed or {}).items():
        if key in data and str(data[key]) != str(value):
            raise ConfigError(
                f"{prefix}.{key} = {data[key]!r} contradicts objective {spec.name!r} "
                f"(which means {key} = {value!r}); name that objective instead"
            )
        data[key] = value
    return build_config(spec.settings, data, prefix)


def build_objective(stage: StageConfig, job: JobConfig) -> Objective | None:
    """The objective object a stage trains with (None: flow matching)."""
    spec = objective_spec(stage.objective)
    return spec.build(stage_settings(stage), stage, job)


def stage_sampling(stage: StageConfig) -> dict[str, Any] | None:
    """How the model stage ``stage`` trains is meant to be sampled (its objective's
    ``sampling``: e.g. a distilled student's ``{"steps": K, "cfg": 0.0}``), or None for the
    guided many-step default."""
    spec = objective_spec(stage.objective)
    return None if spec.sampling is None else dict(spec.sampling(stage_settings(stage)))


def objective_adapters(stage: StageConfig) -> dict[str, LoraConfig]:
    """The LoRA adapters (peft name -> config) stage ``stage``'s objective trains itself
    beside the stage's own (its spec's ``adapters``); empty for most objectives."""
    spec = objective_spec(stage.objective)
    return {} if spec.adapters is None else dict(spec.adapters(stage_settings(stage), stage))


def judges_spikes(stage: StageConfig) -> bool:
    """Whether the spike guard judges this stage's loss statistics: ``stage.spike_guard``
    when set, else its objective's default."""
    if stage.spike_guard is not None:
        return stage.spike_guard
    return objective_spec(stage.objective).judges_spikes
