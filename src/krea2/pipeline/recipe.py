"""The demo's stages, declared once: :func:`demo_stages` is the one list from which the run
order, ``--until``'s choices, summary.json, report.html and the closing lines all derive.

Each :class:`DemoStage` says what it does, runs (reading what earlier stages left in the
shared :class:`DemoRun`), and how its result reaches the summary, the report and the
console. The chain (pretrained -> SFT -> PO -> RL = raw) runs in stage order; its
measurement leads the summary and the report.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from krea2.pipeline.config import DemoConfig
from krea2.pipeline.demo_run import DemoRun, DemoStage, Section


def demo_stages(cfg: DemoConfig) -> list[DemoStage]:
    """The demo's stages in the order they run (one export per training resolution)."""
    from krea2.pipeline import (
        chain,
        curation,
        expander_stage,
        preference,
        rl_stage,
        sft_merge,
        sft_merge_report,
        style_report,
        style_stage,
        turbo_report,
        turbo_stage,
    )

    exports = [
        DemoStage(
            f"export-{s.resolution}",
            f"export {s.resolution}px Parquet shards for {s.name}",
            lambda d, s=s: curation.export_stage(
                d.cluster, d.shard_dir(s.name), s.resolution, s.batch_size, d.log
            ),
            summary=lambda d: {
                "export": {
                    str(s.resolution): d.results[f"export-{s.resolution}"] for s in cfg.train.stages
                }
            },
        )
        for s in cfg.train.stages
    ]
    kinds = list(preference.OBJECTIVES)
    tuned = [
        DemoStage(
            preference.stage_name(kind),
            preference.OBJECTIVES[kind],
            lambda d, kind=kind: preference.run_objective(
                d.cfg,
                d.model(sft_merge.STAGE)[0],
                d.out / "preference",
                kind,
                list(d.split.train),
                d.held_out,
            ),
            # the preference stages share one summary entry and one section: the last's
            summary=(lambda d: {"preference": preference.summary(_preference(d))})
            if kind == kinds[-1]
            else None,
            sections=(lambda d: [("Preference optimization", _preference_section(d))])
            if kind == kinds[-1]
            else None,
            lines=lambda d, kind=kind: [preference.summary_line(kind, d.results[_pref(kind)])],
        )
        for kind in kinds
    ]
    return [
        DemoStage(
            "shards",
            f"start {cfg.shards} embedded krablet shards",
            lambda d: {"cluster": str(curation.start_shards(d.out, d.cfg.shards))},
            always=True,
        ),
        DemoStage(
            "pool",
            "generate the raw ShapesWorld pool with injected defects",
            _pool,
            summary=lambda d: {"pool": d.results["pool"]},
        ),
        DemoStage(
            "curate",
            f"ingest, curate and caption with {cfg.workers} worker processes per job",
            lambda d: curation.curate_pool(
                d.out / "pool", d.cluster, d.cfg.workers, d.log, d.cfg.curate
            ),
            summary=lambda d: {
                "curation": {k: v for k, v in d.results["curate"].items() if k != "examples"}
            },
            sections=_curation_sections,
        ),
        *exports,
        DemoStage(
            "pretrain",
            "pretrain the tiny DiT at each resolution in turn",
            _pretrain,
            sections=_loss_section,
        ),
        DemoStage("sample", "sample held-out prompts with fixed seeds", _sample),
        DemoStage(
            "score",
            "score the samples with the rubric verifier (ShapesEval)",
            _score,
            summary=lambda d: {
                "shapes_eval": {
                    n: {k: v for k, v in e.items() if k != "per_image"}
                    for n, e in d.results["score"].items()
                }
            },
            sections=_score_sections,
            lines=lambda d: [
                f"ShapesEval {n:<22} {e['shapes_eval']:.3f}  {e['by_kind']}"
                for n, e in d.results["score"].items()
            ],
        ),
        DemoStage(
            sft_merge.STAGE,
            sft_merge.WHAT,
            lambda d: sft_merge.run_demo_stage(
                d.cfg, d.job, d.out / "sft-merge", d.split.train, d.held_out
            ),
            summary=lambda d: {"sft_merge": sft_merge.summary(d.results[sft_merge.STAGE])},
            sections=lambda d: [
                (
                    "Domain SFT and merging",
                    sft_merge_report.report_section(d.results[sft_merge.STAGE], smoke=d.cfg.smoke),
                )
            ],
        ),
        *tuned,
        DemoStage(
            rl_stage.STAGE,
            rl_stage.WHAT,
            lambda d: rl_stage.run_demo_stage(
                d.cfg,
                d.model(_pref("stpo"))[0],
                d.out / "rl",
                list(d.split.train),
                d.held_out,
                {"cfg": p} if (p := _drawn_alike(d).get("po-cfg")) else None,
            ),
            summary=lambda d: {"rl": rl_stage.summary(d.results[rl_stage.STAGE])},
            sections=lambda d: [
                (
                    "RL without CFG",
                    rl_stage.report_section(d.results[rl_stage.STAGE], d.prompts, _upscale()),
                )
            ],
            lines=lambda d: [rl_stage.summary_line(d.results[rl_stage.STAGE])],
        ),
        DemoStage(
            chain.STAGE,
            "measure every chain model alike, with and without CFG",
            _chain,
            summary=lambda d: {"chain": chain.summary(d.results[chain.STAGE])},
            sections=lambda d: [
                (
                    "The chain: pretrained → SFT → PO → RL (raw)",
                    chain.report_section(d.results[chain.STAGE]),
                )
            ],
            lines=lambda d: [f"chain: {x}" for x in chain.verdicts(d.results[chain.STAGE])],
            leads=True,
        ),
        DemoStage(
            turbo_stage.STAGE,
            turbo_stage.WHAT,
            _turbo,
            summary=lambda d: {"turbo": turbo_report.summary(d.results[turbo_stage.STAGE])},
            sections=lambda d: [
                (
                    "Turbo: raw distilled by TDM",
                    turbo_report.report_section(
                        d.results[turbo_stage.STAGE], d.prompts, _upscale()
                    ),
                )
            ],
            lines=lambda d: turbo_report.summary_lines(d.results[turbo_stage.STAGE]),
        ),
        DemoStage(
            style_stage.STAGE,
            style_stage.WHAT,
            _style,
            summary=lambda d: {"style": style_report.summary(d.results[style_stage.STAGE])},
            sections=lambda d: [
                (
                    "Style reference on raw: reconstruction, self-supervised, oracle",
                    style_report.report_section(d.results[style_stage.STAGE], _upscale()),
                )
            ],
            lines=lambda d: style_report.summary_lines(d.results[style_stage.STAGE]),
        ),
        DemoStage(
            expander_stage.STAGE,
            expander_stage.WHAT,
            lambda d: expander_stage.run_demo_stage(
                d.cfg,
                d.job,
                d.out / "expander",
                d.held_out,
                model=d.model(rl_stage.STAGE),
                cfg_scale=0.0,
            ),
            summary=lambda d: {"expander": expander_stage.summary(d.results[expander_stage.STAGE])},
            sections=lambda d: [
                (
                    "Prompt expander",
                    expander_stage.report_section(d.results[expander_stage.STAGE], _upscale()),
                )
            ],
            lines=lambda d: [expander_stage.summary_line(d.results[expander_stage.STAGE])],
        ),
    ]


def _pref(kind: str) -> str:
    from krea2.pipeline import preference

    return preference.stage_name(kind)


def _preference(d: DemoRun) -> dict[str, dict]:
    from krea2.pipeline import preference

    return {kind: d.results[_pref(kind)] for kind in preference.OBJECTIVES}


def _preference_section(d: DemoRun) -> str:
    from krea2.pipeline.report import preference_section

    return preference_section(_preference(d), d.prompts)


def _upscale() -> Callable[[np.ndarray], np.ndarray]:
    from krea2.pipeline.report import upscale

    return upscale


def _pool(d: DemoRun) -> dict:
    from krea2.pipeline.pool import build_pool

    return build_pool(d.cfg.pool, d.split, d.out / "pool", d.cfg.workers)


def _curation_sections(d: DemoRun) -> list[Section]:
    from krea2.pipeline.report import curation_sections

    return curation_sections(d.results["curate"], d.out / "pool")


def _pretrain(d: DemoRun) -> dict:
    from krea2.pipeline import training

    return training.pretrain(d.job)


def _loss_section(d: DemoRun) -> list[Section]:
    from krea2.pipeline import html

    curves = d.results["pretrain"]["curves"]
    return [("Training loss per stage", html.line_chart(curves, x_label="step", y_label="loss"))]


def _sample(d: DemoRun) -> dict:
    """Held-out samples of the untrained model and after each pretraining stage, with
    ``[eval]``'s steps and CFG: ``out/samples/NAME.npy``; the pretrained model (the last
    stage, the chain's start) on every ``[eval]`` seed, the others on the first 3 (they
    show the way there; the 30-minute budget holds no more)."""
    from krea2.infra.progress import progress
    from krea2.pipeline import evaluation

    job, ev = d.job, d.cfg.eval
    (d.out / "samples").mkdir(exist_ok=True)
    names = {}
    last = len(job.stages) - 1
    checkpoints = [("untrained", 0, False, list(ev.seeds[:3]))]
    checkpoints += [(f"after {s.name}", i, True, list(ev.seeds if i == last else ev.seeds[:3]))
                    for i, s in enumerate(job.stages)]  # fmt: skip
    total = sum(ev.steps * len(seeds) for *_, seeds in checkpoints)
    with progress("sample", total, unit="step") as bar:
        for name, index, trained, seeds in checkpoints:
            images = evaluation.sample(
                job, index, trained, d.prompts, seeds, ev.steps, ev.cfg, on_step=bar.advance
            )
            np.save(d.out / "samples" / f"{name}.npy", images)
            names[name] = list(images.shape)
    return names


def _score(d: DemoRun) -> dict:
    from krea2.pipeline import evaluation

    return {
        name: evaluation.shapes_eval(np.load(d.out / "samples" / f"{name}.npy"), d.held_out)
        for name in d.results["sample"]
    }


def _score_sections(d: DemoRun) -> list[Section]:
    from krea2.pipeline.report import score_sections

    return score_sections(d.results["score"], d.out / "samples")


def _chain(d: DemoRun) -> dict:
    """Every chain model measured alike (:func:`krea2.pipeline.chain.measure_chain`), on
    the samples the stages before drew the same way (:func:`_drawn_alike`)."""
    from krea2.pipeline import chain, preference, rl_stage, sft_merge

    job = d.job
    models = {
        "pretrained": chain.model_record(job, len(job.stages) - 1),
        "sft": d.results[sft_merge.STAGE]["model"],
        "po": d.results[preference.stage_name("stpo")]["model"],
        "raw": d.results[rl_stage.STAGE]["model"],
    }
    ev = d.cfg.eval
    return chain.measure_chain(
        models,
        d.out / "chain",
        d.prompts,
        d.targets,
        list(ev.seeds),
        ev.steps,
        ev.cfg,
        cached=_drawn_alike(d),
    )


def _drawn_alike(d: DemoRun) -> dict:
    from krea2.pipeline import chain

    last = d.out / "samples" / f"after {d.job.stages[-1].name}.npy"
    return chain.drawn_alike(d.results, d.cfg.eval, last)


def _turbo(d: DemoRun) -> dict:
    """raw distilled into Turbo, measured against raw with the guidance it was distilled
    from; the teacher's 20-step samples are the chain's where they were drawn alike."""
    from krea2.curate.shapes import eval_prompt
    from krea2.pipeline import chain, rl_stage, turbo_stage

    raw, ev = d.results[chain.STAGE]["models"]["raw"], d.cfg.eval
    scale = turbo_stage.teacher_scale(d.cfg.turbo, ev.cfg)
    cached = {"no_cfg": raw["no_cfg"]["samples"]}
    if scale == ev.cfg:
        cached["cfg"] = raw["cfg"]["samples"]
    return turbo_stage.run_demo_stage(
        d.cfg.turbo,
        d.model(rl_stage.STAGE),
        d.out / "turbo",
        [eval_prompt(c) for c in d.split.train],
        d.prompts,
        d.targets,
        list(ev.seeds),
        ev.steps,
        scale,
        cached,
        turbo_stage.free_prompts(d.held_out),
    )


def _style(d: DemoRun) -> dict:
    """A style module on raw, trained three ways and measured on held-out prompts x
    held-out references at [eval]'s seeds and steps, raw without CFG."""
    from krea2.pipeline import rl_stage, style_stage

    ev = d.cfg.eval
    return style_stage.run_demo_stage(d.cfg.style, d.model(rl_stage.STAGE), d.out / "style",
                                      list(d.split.train), d.held_out, list(ev.seeds),
                                      ev.steps)  # fmt: skip


def run_order(stages: list[DemoStage]) -> list[str]:
    """The stage names as they run, then ``report``."""
    return [s.name for s in stages] + ["report"]
