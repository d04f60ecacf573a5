"""ShapesWorld proof of RL without CFG (rl part 2), on the demo's own pretrained model:
DiffusionNFT and GRPO (``krea2.rl.online.rl_stage``) from the same start, with the same
rewards (the rubric verifier + 0.5 x the artifact reward, GDPO), the same curated prompt
pool and the same rollout budget, measured on the demo's held-out prompts without CFG
(every ``eval_every`` iterations, 1 seed: the curves against rollout images and wall time;
at the end 3 seeds) against the pretrained model with and without CFG 3.

    uv run --frozen python -m benchmarks.rl_grpo_proof --demo DIR [--work DIR]
        [--variants nft,grpo] [--set key=value ...] [--report-only]

``--demo DIR``: a full ``krea2 demo --out DIR`` whose pretraining finished (its
``run/checkpoints``). ``--set`` changes an ``RlStageSettings`` field for every variant
(``--set steps=80``); a variant ``NAME:key=value;key=value`` changes it for one (e.g.
``grpo-sum:objective=grpo;aggregation=sum``). Each variant resumes under WORK/NAME;
``--report-only`` writes the section from what the runs have logged so far (an unfinished
run is reported at its last logged evaluation, marked unfinished). Writes
benchmarks/results/rl-grpo-proof.json and the ``rl-grpo-proof`` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.report import parse_settings, table, write_results

# The budget the proof ran with on 2 shared cores (docs/rl.md, "Proof of RL without CFG").
DEFAULTS = {
    "steps": 40, "prompts_per_step": 4, "group_size": 8, "lr": 3e-4, "max_train_prompts": 64,
    "pool_samples": 4, "sample_steps": 8, "window_start_max": 3, "eval_every": 10,
    "micro_batch": 16, "inner_steps": 2, "eval_tuned_cfg": False,
}  # fmt: skip


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME`` (objective = NAME) or ``NAME:key=value;key=value``."""
    name, _, rest = text.partition(":")
    return name, parse_settings(rest) if rest else {"objective": name}


def variant_settings(common: dict, kw: dict):
    """The ``RlStageSettings`` of a variant: the stage's defaults (its objective
    ``krea2.rl.online.demo_objective``) changed by ``common`` then ``kw``, flat keys of either
    the stage or its ``GrpoConfig``; ``artifact_weight`` and ``shape_weight`` set the reward
    weights; DiffusionNFT has no SDE window, GRPO's is 2 steps by default."""
    from dataclasses import asdict

    from krea2.rl.online import RlStageSettings, settings_with
    from krea2.rl.online.stage import REWARD_KINDS

    changes = {**common, **kw}
    weights = {"rubric": 1.0, "artifact": changes.pop("artifact_weight", 0.5)}
    if (shape := changes.pop("shape_weight", 0.0)) > 0:
        weights["shape"] = shape
    changes |= {"weights": weights, "rewards": {k: REWARD_KINDS[k] for k in weights}}
    if changes.get("objective", "nft") == "nft":
        changes |= {"window_size": 0, "window_start_max": 0}
    else:  # GRPO's SDE window: 2 steps starting in the first 4 unless a variant says
        changes = {"window_size": 2, "window_start_max": 3} | changes
    return settings_with(asdict(RlStageSettings()), changes)


def flat(settings: dict) -> dict:
    """A result's settings with its objective's keys beside the stage's."""
    return {**{k: v for k, v in settings.items() if k != "grpo"}, **settings.get("grpo", {})}


def demo_job(demo: Path):
    from krea2.pipeline.config import demo_training_job, load_demo_config

    cfg = load_demo_config(False)
    job, finished = demo_training_job(cfg, demo)
    if not finished:
        raise SystemExit(f"{demo} has no finished pretraining; run krea2 demo --out {demo}")
    return cfg, job


def partial(work: Path, name: str) -> dict | None:
    """A variant's logged curves when its run has not finished (None: nothing logged)."""
    from krea2.rl.online.stage import curves

    c = curves(work / name)
    return c if c["step"] else None


def last_eval(c: dict) -> tuple[int, float, float, float, float]:
    """(step, rollout images before it, seconds, ShapesEval, all-correct) of the last
    logged evaluation: the model after ``step`` updates."""
    i = max(k for k, v in enumerate(c["eval_shapes"]) if v is not None)
    before = c["rollout_images"][i - 1] if i else 0.0
    seconds = c["seconds"][i - 1] if i else 0.0
    return c["step"][i], before, seconds, c["eval_shapes"][i], c["eval_all_correct"][i]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", type=Path, default=Path("/tmp/rl18/demo"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/krea2-rl-grpo-proof"))
    ap.add_argument("--variants", default="nft,grpo")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    from krea2.curate.shapes import concept_scene, eval_prompt
    from krea2.pipeline import evaluation
    from krea2.rl.online import rl_stage

    cfg, job = demo_job(args.demo)
    split, held = evaluation.demo_concepts(cfg)
    common = dict(DEFAULTS)
    for item in args.sets:
        common.update(parse_settings(item))
    results, partials = {}, {}
    t0 = time.perf_counter()
    for text in args.variants.split(","):
        name, kw = parse_variant(text)
        done = args.work / f"{name}.json"
        if args.report_only:
            if done.exists():
                results[name] = json.loads(done.read_text())
            elif (c := partial(args.work, name)) is not None:
                partials[name] = c
            continue
        results[name] = rl_stage(
            job, len(job.stages) - 1, args.work, [eval_prompt(c) for c in split.train],
            [eval_prompt(c) for c in held], [concept_scene(c) for c in held],
            variant_settings(common, kw), name,
        )  # fmt: skip
    pre = json.loads((args.work / "eval-pretrained.json").read_text())
    pool = json.loads((args.work / "pool.json").read_text())["counts"]
    artifact = _calibrated_head(args.work)
    base_noise = _artifacts(pre["no_cfg"]["samples"], artifact)[0]
    bound = NOISE_BOUND * base_noise

    def row(label, images, minutes, m, seeds):  # type: ignore[no-untyped-def]
        noise, art = _artifacts(m["samples"], artifact) if m else ("", "")
        within = "" if noise == "" else ("yes" if noise <= bound else "**no**")
        return [label, images, minutes, f"{m['shapes_eval']:.3f}" if m else "",
                f"{m['all_correct']:.3f}" if m else "", _num(noise), within, _num(art),
                seeds]  # fmt: skip

    rows = [row("pretrained, no CFG", "", "", pre["no_cfg"], "3"),
            row("pretrained, CFG 3", "", "", pre["cfg"], "3")]  # fmt: skip
    curve_rows, described = [], []
    for name, r in results.items():
        c = r["curves"]
        label = f"{name}, no CFG" + (f" (stopped: {r['stopped']})" if r["stopped"] else "")
        rows.append(row(label, f"{c['rollout_images'][-1]:.0f}", f"{c['seconds'][-1] / 60:.1f}",
                        r["tuned"]["no_cfg"], "3"))  # fmt: skip
        curve_rows += _curve_rows(name, c)
        described.append(f"- `{name}`: {_differences(r['settings'], common)}")
    for name, c in partials.items():
        step, images, seconds, score, allc = last_eval(c)
        rows.append([f"{name}, no CFG (unfinished: after {step} of its iterations)",
                     f"{images:.0f}", f"{seconds / 60:.1f}", f"{score:.3f}", f"{allc:.3f}",
                     "", "", "", "1"])  # fmt: skip
        curve_rows += _curve_rows(name, c)
    headers = ["model", "rollout images", "RL minutes", "ShapesEval", "all correct",
               "background noise", f"within {NOISE_BOUND:g}x", "artifact (calibrated)",
               "seeds"]  # fmt: skip
    s = variant_settings(common, {})
    g = s.grpo
    md = (
        "## RL without CFG on ShapesWorld (`benchmarks/rl_grpo_proof.py`)\n\n"
        f"The full demo's pretrained model; {cfg.eval.max_prompts} held-out prompts, "
        f"{s.eval_steps} Euler steps. Pool: {', '.join(f'{v} {k}' for k, v in pool.items())} "
        f"of {sum(pool.values())} training "  # the pool is shared: the first run's size
        f"prompts ({s.pool_samples} no-CFG samples each). Common settings: each iteration "
        f"{s.prompts_per_step} prompts x {g.group_size} images, {g.sample_steps}-step "
        f"rollouts without CFG, rewards rubric + {g.weights['artifact']} x artifact "
        f"({g.aggregation}), lr {s.lr:g}, "
        + (f"LoRA rank {s.lora_rank}" if s.lora_rank else "full fine-tuning")
        + f", KL {g.kl_beta:g}. GRPO: SDE window {common.get('window_size', 2)} steps (noise "
        f"level {g.noise_level}), {g.inner_steps} inner steps, clip {g.clip}; DiffusionNFT: "
        f"beta {g.nft_beta}, ODE rollouts. Per variant:\n\n" + "\n".join(described) + "\n\n"
        "Artifact measures, the same for every row (computed here from the stored "
        "samples): background noise = `krea2.rl.online.background_noise` (mean |high-pass| "
        "over the plain background, grey levels; no reward sees it), bound "
        f"{NOISE_BOUND:g}x the pretrained no-CFG value = {bound:.2f}; artifact = the head "
        "calibrated on the pretrained model's samples (`artifact-calibrated.npz`, "
        "1 - P(defect)).\n\n"
        + table(headers, rows)
        + "\n\nShapesEval without CFG against rollout images and wall time (1 seed, the "
        "model after `step` updates; background noise where the run logged it):\n\n"
        + table(CURVE_HEADERS, curve_rows)
        + f"\n\nCommand: `uv run --frozen python -m benchmarks.rl_grpo_proof --demo DIR "
        f"--variants {args.variants}"
        + (" --report-only`" if args.report_only else "`")
        + f" ({(time.perf_counter() - t0) / 60:.1f} min).\n"
    )
    # Per-iteration curves stay in each run's WORK/NAME.json; the record keeps the evaluated
    # iterations (what the tables show), so it does not grow by every step of every run.
    summary = {"results": {k: {**r, "curves": _at_evals(r["curves"])} for k, r in results.items()},
               "partial": {k: _at_evals(c) for k, c in partials.items()}, "pretrained": pre,
               "pool": pool, "settings": common, "noise_bound": bound}  # fmt: skip
    print(md)
    write_results("rl-grpo-proof", summary, md)


NOISE_BOUND = 2.0
CURVE_HEADERS = ["variant", "step", "rollout images", "RL minutes", "ShapesEval", "all correct",
                 "background noise"]  # fmt: skip


def _at_evals(c: dict[str, list]) -> dict[str, list]:
    """The rows of curves ``c`` (:func:`krea2.rl.online.stage.curves`) that carry an
    evaluation, every key kept."""
    keep = [i for i, v in enumerate(c["eval_shapes"]) if v is not None]
    return {k: [v[i] for i in keep] for k, v in c.items()}


def _num(v) -> str:  # type: ignore[no-untyped-def]
    return v if isinstance(v, str) else f"{v:.3f}"


def _calibrated_head(work: Path):  # type: ignore[no-untyped-def]
    from krea2.rl.rewards import ArtifactReward

    path = work / "artifact-calibrated.npz"
    return ArtifactReward.load(path) if path.exists() else None


def _artifacts(samples: str, head) -> tuple[float, float | str]:  # type: ignore[no-untyped-def]
    """(mean background noise, mean calibrated artifact reward or '') of a samples file."""
    import numpy as np

    from krea2.rl.online import background_noise

    images = np.load(samples)
    flat = images.reshape(-1, *images.shape[2:])
    art = float(np.mean(head(flat, ["x"] * len(flat)).scores)) if head is not None else ""
    return float(background_noise(flat).mean()), art


def _differences(settings: dict, common: dict) -> str:
    """A variant's settings that differ from the common ones (and its objective)."""
    from dataclasses import asdict

    settings, base = flat(settings), flat(asdict(variant_settings(common, {})))
    keys = ["objective"] + [k for k in settings if k != "objective" and settings[k] != base.get(k)]
    return ", ".join(f"{k}={settings[k]}" for k in keys)


def _curve_rows(name: str, c: dict) -> list[list[str]]:
    rows = []
    for i, v in enumerate(c["eval_shapes"]):
        if v is None:
            continue
        images = c["rollout_images"][i - 1] if i else 0.0
        seconds = c["seconds"][i - 1] if i else 0.0
        noise = (c.get("eval_bg_noise") or [None] * len(c["step"]))[i]
        rows.append([name, str(c["step"][i]), f"{images:.0f}", f"{seconds / 60:.1f}",
                     f"{v:.3f}", f"{c['eval_all_correct'][i]:.3f}",
                     "" if noise is None else f"{noise:.3f}"])  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
