"""The demo's chain: pretrained -> SFT -> PO -> RL, whose end is the final model (raw).

Every chain model is a finished stage of a trainer run (:func:`model_record`: its run
directory and stage name; the run's ``config.toml`` says how it was trained), each
starting from the one before, so a user can sample, export or distil any of them with the
trainer's commands. The ablations (DPO, the other merges) are branches from the chain
model they ablate and never feed it.

:func:`measure_chain` measures every chain model the same way, on the same held-out
prompts and seeds, with ``[eval]``'s CFG and without CFG: ShapesEval, the share of images
with every requirement right, the artifact reward (one head trained on renders, the same
yardstick for every model) and the background noise; and each model's difference to the
one before it with its paired standard error over the prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from krea2.pipeline.evaluation import paired_delta
from krea2.trainer import JobConfig

STAGE = "chain"  # the demo stage that measures the chain
# (name, what it is): the chain in order; the last is the final model
CHAIN = (
    ("pretrained", "pretraining, 32 then 64 px"),
    ("sft", "domain SFTs of the pretrained model, merged"),
    ("po", "STPO from the SFT model"),
    ("raw", "RL without CFG from the PO model: the final model"),
)
SETTINGS = (("cfg", "with CFG"), ("no_cfg", "without CFG"))
HEADERS = ["chain stage", "ShapesEval, CFG", "Δ ± SE", "all correct, CFG",
           "ShapesEval, no CFG", "Δ ± SE", "all correct, no CFG", "artifact, no CFG",
           "background noise, no CFG"]  # fmt: skip


def model_record(job: JobConfig, index: int) -> dict[str, str]:
    """A chain model as JSON: the run directory and the stage's name."""
    return {"run": str(job.run_dir), "stage": job.stages[index].name}


def load_model(record: dict[str, str]) -> tuple[JobConfig, int]:
    """The (job, stage index) of a :func:`model_record`, from its run's ``config.toml``."""
    from krea2.trainer import load_job

    run = Path(record["run"])
    job = load_job(run / "config.toml")
    job.run_dir = run
    return job, [s.name for s in job.stages].index(record["stage"])


def adopt_merge(job: JobConfig, index: int, work: Path, s: Any, files: list[Path]) -> JobConfig:
    """The merge ``s.chain_merge`` of the domain SFTs under ``work`` (``s``: the stage's
    :class:`~krea2.pipeline.sft_merge.SftMergeSettings`; the SFTs made by its
    ``run_sft_merge``), saved as ``work/chain-merge.safetensors`` and adopted as stage
    ``sft`` after stage ``index`` of ``job`` in the run ``work/chain``; returns its job."""
    from krea2.dit import save_weights
    from krea2.infra import CheckpointManager
    from krea2.infra.atomic import write_with
    from krea2.trainer import adopt_weights, average, stage_root, task_arithmetic, ties_merge

    path = work / "chain-merge.safetensors"
    if not path.is_file():  # (written whole: a killed merge leaves no file)
        root = CheckpointManager(stage_root(job, job.stages[index]))
        base = root.path_of(root.latest_step())
        wa = s.weight_a
        weights = {
            "uniform": lambda: average(files),
            "weighted": lambda: average(files, [wa, 1 - wa]),
            "ties": lambda: ties_merge(base, files, density=s.density),
            "task": lambda: task_arithmetic(base, files),
        }[s.chain_merge]()
        write_with(path, lambda tmp: save_weights(weights, tmp))
    return adopt_weights(job, index, "sft", path, work / "chain")


def drawn_alike(results: dict[str, dict], ev: Any, pretrained_cfg: Path) -> dict[str, Path]:
    """The chain's samples ("MODEL-cfg" / "MODEL-no_cfg" -> .npy) that earlier stages of
    the demo (``results``: stage name -> result) drew on the held-out prompts with
    ``ev``'s (``[eval]``'s) seeds, steps and CFG: the pretrained model's CFG samples
    (``pretrained_cfg``, the ``sample`` stage's), the preference stage's start and result
    (SFT and PO with CFG) and the RL stage's (PO and raw, without CFG and with it). A stage
    that sampled otherwise (a recipe may set its own seeds, steps or CFG) is not reused.
    Sampling them again draws the same pixels: on 2026-12-06 five of the chain's eight
    sample sets were byte-identical copies, about 60 s of the full demo."""
    from krea2.pipeline import preference, rl_stage

    seeds = list(ev.seeds)
    out = {"pretrained-cfg": pretrained_cfg}
    po = results.get(preference.stage_name("stpo"))
    ps = po["settings"] if po else {}
    if po and (ps["sample_steps"], ps["sample_cfg"], list(ps["eval_seeds"])) == (
        ev.steps, ev.cfg, seeds
    ):  # fmt: skip
        out["sft-cfg"] = Path(po["pretrained_samples"])
        out["po-cfg"] = Path(po["samples"])
    rl = results.get(rl_stage.STAGE)
    rs = rl["settings"] if rl else {}
    if rl and (rs["eval_steps"], list(rs["eval_seeds"])) == (ev.steps, seeds):
        for model, key in (("po", "pretrained"), ("raw", "tuned")):
            out[f"{model}-no_cfg"] = Path(rl[key]["no_cfg"]["samples"])
            if rs["eval_cfg"] == ev.cfg and "cfg" in rl[key]:
                out[f"{model}-cfg"] = Path(rl[key]["cfg"]["samples"])
    return out


def measure_chain(
    models: dict[str, dict[str, str]],
    work: Path,
    prompts: list[str],
    targets: list,
    seeds: list[int],
    steps: int,
    cfg_scale: float,
    cached: dict[str, Path] | None = None,
) -> dict:
    """Measure each chain model (name -> :func:`model_record`, in chain order) with CFG
    ``cfg_scale`` and without; samples uint8 [P, S, H, W, 3] kept under ``work`` (or taken
    from ``cached``: ``"NAME-cfg"`` -> an ``.npy`` sampled the same way). Returns
    ``{"models": {name: {"record", "cfg": m, "no_cfg": m}}, "settings": ...}`` where m has
    ``shapes_eval``, ``all_correct``, ``artifact``, ``bg_noise``, ``per_image``, the
    ``samples`` path and, after the first model, ``delta``/``delta_all_correct`` (paired
    differences to the model before, each ``{"delta", "se"}``)."""
    from krea2.curate.shapes import shapes_eval
    from krea2.infra.atomic import cached_array
    from krea2.rl.online import background_noise, shapes_rewards
    from krea2.trainer import sample_stage

    work.mkdir(parents=True, exist_ok=True)
    artifact = shapes_rewards(work)["artifact"]
    cached = cached or {}
    out: dict[str, Any] = {}
    previous: dict[str, Any] | None = None
    sampled: dict[tuple[str, str, str], Path] = {}  # a model kept by a stage is sampled once
    for name, record in models.items():
        row: dict[str, Any] = {"record": record}
        for key, scale in (("cfg", cfg_scale), ("no_cfg", 0.0)):
            same = sampled.get((record["run"], record["stage"], key))
            path = cached.get(f"{name}-{key}") or same or work / f"{name}-{key}.npy"
            sampled[(record["run"], record["stage"], key)] = path
            images = cached_array(
                path, lambda record=record, scale=scale: sample_stage(
                    *load_model(record), prompts, seeds, steps, scale
                )
            )  # fmt: skip
            flat = images.reshape(-1, *images.shape[2:])
            score = shapes_eval(images, targets)
            art = artifact(flat, [p for p in prompts for _ in seeds])
            m = {
                "shapes_eval": score.score,
                "all_correct": score.all_correct,
                "shapes_eval_forced": score.score_forced,  # the verifier before "unclear"
                "unclear_rate": score.unclear_rate,
                "artifact": float(np.mean(art.scores)),
                "bg_noise": float(background_noise(flat).mean()),
                "per_image": score.per_image,
                "samples": str(path),
            }
            if previous is not None:
                before = previous[key]["per_image"]
                m["delta"] = paired_delta(score.per_image, before)
                m["delta_all_correct"] = paired_delta(
                    _all_right(score.per_image), _all_right(before)
                )
            row[key] = m
        out[name] = previous = row
    return {
        "models": out,
        "settings": {"prompts": len(prompts), "seeds": list(seeds), "steps": steps,
                     "cfg": cfg_scale},
    }  # fmt: skip


def _all_right(per_image: Any) -> np.ndarray:
    return (np.asarray(per_image, np.float64) >= 1.0 - 1e-9).astype(np.float64)


def _score(m: dict) -> str:
    forced = m.get("shapes_eval_forced")
    return f"{m['shapes_eval']:.3f}" + (f" ({forced:.3f})" if forced is not None else "")


def _delta(m: dict) -> str:
    d = m.get("delta")
    return f"{d['delta']:+.3f} ± {d['se']:.3f}" if d else ""


def rows(result: dict) -> list[list[str]]:
    """Rows of :data:`HEADERS`, one per chain model in order."""
    out = []
    for name, row in result["models"].items():
        c, n = row["cfg"], row["no_cfg"]
        out.append([name, _score(c), _delta(c), f"{c['all_correct']:.3f}",
                    _score(n), _delta(n), f"{n['all_correct']:.3f}",
                    f"{n['artifact']:.3f}", f"{n['bg_noise']:.2f}"])  # fmt: skip
    return out


def summary(result: dict) -> dict:
    """summary.json's ``chain``: per model its measures (per-image scores and sample paths
    left out) and where it lives."""
    drop = ("per_image", "samples")
    return {
        name: {"model": row["record"]}
        | {k: {f: v for f, v in row[k].items() if f not in drop} for k, _ in SETTINGS}
        for name, row in result["models"].items()
    } | {"settings": result["settings"]}


def verdicts(result: dict) -> list[str]:
    """What the chain shows, one sentence each: every step against one paired standard
    error (with CFG before RL, without CFG from RL on), and raw without CFG against the
    pretrained model with CFG."""
    models = result["models"]
    names = list(models)
    lines = []
    for name in names[1:]:
        key = "no_cfg" if name == "raw" else "cfg"
        d = models[name][key]["delta"]
        fell = d["delta"] < -d["se"]
        lines.append(
            f"{name}: ShapesEval {'without' if key == 'no_cfg' else 'with'} CFG "
            f"{d['delta']:+.3f} ± {d['se']:.3f} against the model before"
            + (" — lower by more than one standard error" if fell else "")
        )
    if "raw" in models and "pretrained" in models:
        raw, pre = models["raw"]["no_cfg"], models["pretrained"]["cfg"]
        d = paired_delta(raw["per_image"], pre["per_image"])
        lines.append(
            f"raw without CFG {raw['shapes_eval']:.3f} (all correct {raw['all_correct']:.3f}) "
            f"against pretrained with CFG {pre['shapes_eval']:.3f} ({pre['all_correct']:.3f}): "
            f"{d['delta']:+.3f} ± {d['se']:.3f}"
        )
    return lines


def report_section(result: dict) -> str:
    """HTML: the chain's table, what it shows, and one figure of ShapesEval (with and
    without CFG) and all-correct per chain stage."""
    from krea2.pipeline import html

    models = result["models"]
    series = {
        f"{label} {what}": [(float(i), float(m[key][field])) for i, m in enumerate(models.values())]
        for key, what in SETTINGS
        for field, label in (("shapes_eval", "ShapesEval"), ("all_correct", "all correct"))
    }
    st = result["settings"]
    names = ", ".join(f"{i} {name}" for i, name in enumerate(models))
    items = "".join(f"<li>{html.escape(line)}</li>" for line in verdicts(result))
    return (
        html.table(HEADERS, rows(result))
        + f'<p class="note">Each model of the chain starts from the one before; raw is the '
        f"final model. Measured alike: {st['prompts']} held-out prompts × {len(st['seeds'])} "
        f"seeds, {st['steps']} Euler steps, CFG {st['cfg']:g} or none. Δ: the difference to "
        "the model before on the same prompts and seeds, ± its paired standard error over "
        "the prompts. In brackets: the verifier's forced-choice score, before an object "
        "whose shape wins by less than a calibrated margin counted as unclear (shown beside "
        "the new score for one release). Artifact: one head trained on renders "
        "(1 − P(defect)), the same for every model.</p>"
        + f"<ul>{items}</ul>"
        + html.line_chart(series, x_label=f"chain stage ({names})", y_label="score", log=False)
    )
