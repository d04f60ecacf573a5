"""What the demo's stages share and how one is declared: :class:`DemoRun` (the recipe, the
output folder, the held-out evaluation, each finished stage's result),
:class:`DemoStage` (name, what it does, run, summary, report sections, closing lines) and
:func:`write_report`, which builds report.html and summary.json from the stages.
:func:`krea2.pipeline.recipe.demo_stages` lists them.
"""

from __future__ import annotations

import json
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


INTRO = (
    '<p class="note">The Krea 2 pipeline at toy scale: a defect-laden ShapesWorld pool '
    "curated by krablet workers on embedded PostgreSQL shards, exported as Parquet shards at "
    "two resolutions, a tiny single-stream DiT pretrained on them and scored with the rubric "
    "verifier, then post-trained in one chain — domain SFTs merged, STPO on on-policy "
    "pairs, RL without CFG — into the final model (raw), distilled by TDM into a few-step "
    "student without CFG (Turbo) and given a style-reference module, with the prompt "
    "expander in front of raw; the ablations (Diffusion-DPO, the other merges) branch off "
    "the chain model they ablate.</p>"
)


def write_report(
    demo: DemoRun, stages: list[DemoStage], timings: list[tuple[str, float]], note: str | None
) -> dict:
    """Write ``out/report.html`` and ``out/summary.json`` from each stage's own summary
    and sections (a leading stage's first); returns the summary.
    ``note`` (a smoke run's warning) goes at the top of both."""
    from krea2.pipeline import html

    ordered = [s for s in stages if s.leads] + [s for s in stages if not s.leads]
    summary: dict = {"note": note} if note else {}
    sections = []
    for stage in ordered:
        if stage.leads and stage.summary is not None:
            summary.update(stage.summary(demo))
    summary["stages"] = {name: round(sec, 1) for name, sec in timings}
    for stage in ordered:
        if not stage.leads and stage.summary is not None:
            summary.update(stage.summary(demo))
        if stage.sections is not None:
            sections += stage.sections(demo)
    timing = html.table(["stage", "seconds"], [[n, f"{s:.1f}"] for n, s in timings])
    sections.append(("Stage times", timing))
    intro = (f'<p class="warning">{html.escape(note)}</p>' if note else "") + INTRO
    (demo.out / "report.html").write_text(html.page("krea2 demo report", sections, intro))
    (demo.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
