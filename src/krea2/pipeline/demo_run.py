"""What the demo's stages share and how one is declared: :class:`DemoRun` (the recipe, the
output folder, the held-out evaluation, each finished stage's result) and
:class:`DemoStage` (name, what it does, run, summary, report sections, closing lines).
:func:`krea2.pipeline.recipe.demo_stages` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from krea2.pipeline.config import DemoConfig, training_job
from krea2.trainer import JobConfig

Section = tuple[str, str]  # (title, html)


@dataclass
class DemoRun:
    """What the stages share: the recipe, the output folder, the held-out evaluation and
    each finished stage's result by name."""

    cfg: DemoConfig
    out: Path
    results: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from krea2.curate.shapes import concept_scene, eval_prompt
        from krea2.pipeline import evaluation

        self.split, self.held_out = evaluation.demo_concepts(self.cfg)
        self.prompts = [eval_prompt(c) for c in self.held_out]
        self.targets = [concept_scene(c) for c in self.held_out]
        self.log = self.out / "commands.log"

    @property
    def cluster(self) -> Path:
        return Path(self.results["shards"]["cluster"])

    def shard_dir(self, stage_name: str) -> Path:
        return self.out / "shards" / stage_name

    @property
    def job(self) -> JobConfig:
        """The pretraining job (its shards exported by then)."""
        dirs = [self.shard_dir(s.name) for s in self.cfg.train.stages]
        return training_job(self.cfg, self.out / "run", dirs, self.prompts[:8])

    def model(self, stage: str) -> tuple[JobConfig, int]:
        """The chain model a finished stage keeps (its result's ``model`` record)."""
        from krea2.pipeline.chain import load_model

        return load_model(self.results[stage]["model"])


@dataclass(frozen=True)
class DemoStage:
    """One stage: ``run(demo)`` returns its JSON-able result; ``summary(demo)`` the entries
    it adds to summary.json, ``sections(demo)`` its report sections, ``lines(demo)`` what
    the console shows at the end (each None: nothing). ``always``: run even when recorded
    (the embedded shards must be up in every invocation). ``leads``: its summary and
    sections come first."""

    name: str
    what: str
    run: Callable[[DemoRun], dict]
    summary: Callable[[DemoRun], dict] | None = None
    sections: Callable[[DemoRun], list[Section]] | None = None
    lines: Callable[[DemoRun], list[str]] | None = None
    always: bool = False
    leads: bool = False
