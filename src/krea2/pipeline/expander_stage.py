"""Demo stage ``expander``: the prompt expander (``krea2.expander.stage``) in front of the
final model (raw, the chain's end) — SFT on requests written from the exported training
shards' scenes, GDPO with the image, faithfulness and diversity rewards (and the ablation
without the diversity reward), each measured on short requests for the held-out concepts."""

from __future__ import annotations

import glob
from dataclasses import replace
from pathlib import Path

import numpy as np

from krea2.curate.shapes import Concept, concept_scene
from krea2.pipeline.config import DemoConfig
from krea2.trainer import JobConfig

STAGE = "expander"
WHAT = "prompt expander: SFT, then GDPO with and without the diversity reward"
HEADERS = ["prompts to the DiT", "faithful expansions", "ShapesEval on the request",
           "Δ against SFT ± SE", "all correct", "intra-group diversity",
           "distinct expansions"]  # fmt: skip
LABELS = {"sft": "expander after SFT", "gdpo": "expander after GDPO",
          "gdpo-no-diversity": "GDPO without the diversity reward"}  # fmt: skip
CURVE_LABELS = {"gdpo": "GDPO", "gdpo-no-diversity": "GDPO, no diversity"}  # legend-sized


def run_demo_stage(
    cfg: DemoConfig,
    job: JobConfig,
    work: Path,
    held_out: list[Concept],
    model: tuple[JobConfig, int] | None = None,
    cfg_scale: float | None = None,
) -> dict:
    """The expander stage in front of ``model`` (a job and the index of its finished stage;
    None: ``job``'s final stage), with the recipe's ``[expander]`` settings and
    ``[eval]``'s steps and seeds, sampling at ``cfg_scale`` (None: ``[eval]``'s CFG); SFT
    scenes come from the shards of ``job``'s final (pretraining) stage."""
    from krea2.expander import read_shard_scenes, run_expander_stage

    shards = sorted(p for pattern in job.stages[-1].data for p in glob.glob(pattern))
    if not shards:
        raise FileNotFoundError(f"no exported shards match {job.stages[-1].data}")
    scale = cfg.eval.cfg if cfg_scale is None else cfg_scale
    s = replace(cfg.expander, eval_steps=cfg.eval.steps, eval_cfg=scale,
                eval_seeds=list(cfg.eval.seeds))  # fmt: skip
    scenes = read_shard_scenes([Path(p) for p in shards])
    target, index = model if model is not None else (job, len(job.stages) - 1)
    return run_expander_stage(target, index, work, scenes, [concept_scene(c) for c in held_out], s)


def delta_to_sft(result: dict, name: str) -> dict[str, float] | None:
    """Expander ``name``'s ShapesEval minus the SFT expander's, paired over the requests
    (each request's seeds averaged), with its standard error; None for SFT itself or a
    result written before per-request scores were kept."""
    from krea2.pipeline.evaluation import paired_delta

    models = result["models"]
    if name == "sft" or "per_request" not in models[name] or "sft" not in models:
        return None
    return paired_delta(
        np.asarray(models[name]["per_request"])[:, None],
        np.asarray(models["sft"]["per_request"])[:, None],
    )


def rows(result: dict) -> list[list[str]]:
    """Rows of :data:`HEADERS`: the raw requests, then each expander."""
    raw = result["raw"]
    out = [["raw short requests", "", f"{raw['shapes_eval']:.3f}", "",
            f"{raw['all_correct']:.3f}", "", ""]]  # fmt: skip
    for name, m in result["models"].items():
        d = delta_to_sft(result, name)
        out.append([
            LABELS.get(name, name), f"{m['faithful']:.3f}", f"{m['shapes_eval']:.3f}",
            f"{d['delta']:+.3f} ± {d['se']:.3f}" if d else "",
            f"{m['all_correct']:.3f}", f"{m['diversity']:.3f}",
            f"{m['distinct_expansions']:.3f}",
        ])  # fmt: skip
    return out


def summary(result: dict) -> dict:
    """summary.json's ``expander``: the measures per expander (after GDPO with ``delta``,
    the paired difference to SFT ± SE), the raw requests' ShapesEval, the last logged GDPO
    rewards and seconds."""
    keep = ("faithful", "faithfulness_score", "shapes_eval", "all_correct", "diversity",
            "distinct_expansions")  # fmt: skip
    models = {
        name: {k: m[k] for k in keep} | ({"delta": d} if (d := delta_to_sft(result, name)) else {})
        for name, m in result["models"].items()
    }
    return {
        "raw": {k: result["raw"][k] for k in ("shapes_eval", "all_correct")},
        **models,
        "last_rewards": {
            run: {k: v[-1] for k, v in c.items() if k != "step" and v}
            for run, c in result["curves"].items()
        },
        "requests": len(result["requests"]),
        "sft_examples": result["sft_examples"],
        "seconds": result["seconds"],
    }


def summary_line(result: dict) -> str:
    raw, models = result["raw"], result["models"]
    final = models.get("gdpo", models["sft"])
    line = (
        f"Expander: ShapesEval on short requests {raw['shapes_eval']:.3f} raw -> "
        f"{final['shapes_eval']:.3f} expanded (faithful {final['faithful']:.3f}, "
        f"diversity {final['diversity']:.3f}"
    )
    if ablation := models.get("gdpo-no-diversity"):
        line += f"; without the diversity reward {ablation['diversity']:.3f}"
    return line + ")"


def report_section(result: dict, upscale) -> str:  # type: ignore[no-untyped-def]
    """The expander on report.html: the table, GDPO's reward curves for both runs, example
    expansions, and the first seed's images of raw and expanded requests."""
    from krea2.pipeline import html

    parts = [html.table(HEADERS, rows(result))]
    s = result["settings"]
    parts.append(
        f'<p class="note">{len(result["requests"])} short requests for the held-out concepts '
        f"({s['requests_per_concept']} per concept, dropping details on purpose), rendered by "
        "raw (the chain's final model) as ShapesEval samples; the rubric scores each image against "
        "the request's own requirements. Faithful: the expansion keeps every requirement of "
        "the request and contradicts none. Diversity: mean pairwise cosine distance of pixel "
        f"embeddings between the images of {s['group']} sampled expansions of a request. "
        f"SFT on {result['sft_examples']} requests written from the exported shards' scenes "
        f"({s['target']} captions as answers); GDPO {s['gdpo_steps']} steps of "
        f"{s['gdpo_prompts']} requests × {s['group']} expansions.</p>"
    )
    for reward in ("diversity", "rubric", "faithfulness", "artifact"):
        series = {
            CURVE_LABELS.get(run, run): [
                (x, y) for x, y in zip(c["step"], c.get(reward, []), strict=False) if y is not None
            ]
            for run, c in result["curves"].items()
        }
        if any(series.values()):
            parts.append(
                f"<h3>GDPO reward: {reward}</h3>"
                + html.line_chart(
                    {k: v for k, v in series.items() if v},
                    x_label="step",
                    y_label="mean",
                    log=False,
                )
            )
    names = list(result["models"])
    examples = [
        [r, *(result["models"][n]["expansions"][i] for n in names)]
        for i, r in enumerate(result["requests"][:8])
    ]
    parts.append("<h3>Expansions (greedy)</h3>" + html.table(
        ["request", *(LABELS.get(n, n) for n in names)], examples))  # fmt: skip
    columns = [("raw request", np.load(result["raw"]["images"])[:8, 0])]
    columns += [(LABELS.get(n, n), np.load(m["images"])[:8, 0])
                for n, m in result["models"].items()]  # fmt: skip
    parts.append(
        "<h3>Held-out requests, first seed</h3>"
        + html.image_table(
            result["requests"][:8],
            [(label, [html.png_data_uri(upscale(im)) for im in ims]) for label, ims in columns],
        )
    )
    return "".join(parts)
