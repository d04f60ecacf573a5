"""ShapesWorld proof of RL without CFG (rl part 2), on the demo's own pretrained model:
DiffusionNFT and GRPO (``krea2.rl.grpo.rl_stage``) from the same start, with the same
rewards (the rubric verifier + 0.5 x the artifact reward, GDPO), the same curated prompt
pool and the same rollout budget, measured on the demo's held-out prompts without CFG
(every ``eval_every`` iterations, 1 seed: the curves against rollout images and wall time;
at the end 3 seeds) against the pretrained model with and without CFG 3.

    uv run --frozen python benchmarks/rl_grpo_proof.py --demo DIR [--work DIR]
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
import importlib.util
import json
import sys
import time
from pathlib import Path

# As benchmarks/rl_proof.py: drop this folder from sys.path, load report.py by path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("report", HERE / "report.py")
_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_report)
table, write_results = _report.table, _report.write_results

# The budget the proof ran with on 2 shared cores (docs/rl.md, "Proof of RL without CFG").
DEFAULTS = {
    "steps": 40, "prompts_per_step": 4, "group_size": 8, "lr": 3e-4, "max_train_prompts": 64,
    "pool_samples": 4, "sample_steps": 8, "window_start_max": 3, "eval_every": 10,
    "micro_batch": 16, "inner_steps": 2, "eval_tuned_cfg": False,
}  # fmt: skip


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME`` (objective = NAME) or ``NAME:key=value;key=value``."""
    name, _, rest = text.partition(":")
    kw: dict = {} if rest else {"objective": name}
    for item in filter(None, rest.split(";")):
        key, _, value = item.partition("=")
        kw[key] = json.loads(value) if value[:1] in "0123456789-[{tf" else value
    return name, kw


def demo_job(demo: Path):
    from krea2.pipeline.config import load_demo_config, training_job

    cfg = load_demo_config(False)
    job = training_job(cfg, demo / "run", [demo / "shards" / s.name for s in cfg.train.stages], [])
    if not (demo / "run" / "checkpoints" / f"{job.stages[-1].name}.done").exists():
        raise SystemExit(f"{demo} has no finished pretraining; run krea2 demo --out {demo}")
    return cfg, job


def partial(work: Path, name: str) -> dict | None:
    """A variant's logged curves when its run has not finished (None: nothing logged)."""
    from krea2.rl.grpo.stage import curves

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
    from krea2.rl.grpo import RlStageSettings, rl_stage

    cfg, job = demo_job(args.demo)
    split, held = evaluation.demo_concepts(cfg)
    common = dict(DEFAULTS)
    for item in args.sets:
        common.update(parse_variant(f"x:{item}")[1])
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
            RlStageSettings(**{**common, **kw}), name,
        )  # fmt: skip
    pre = json.loads((args.work / "eval-pretrained.json").read_text())
    pool = json.loads((args.work / "pool.json").read_text())["counts"]
    rows = [
        ["pretrained, no CFG", "", "", f"{pre['no_cfg']['shapes_eval']:.3f}",
         f"{pre['no_cfg']['all_correct']:.3f}", f"{pre['no_cfg']['artifact']:.3f}", "3"],
        ["pretrained, CFG 3", "", "", f"{pre['cfg']['shapes_eval']:.3f}",
         f"{pre['cfg']['all_correct']:.3f}", f"{pre['cfg']['artifact']:.3f}", "3"],
    ]  # fmt: skip
    curve_rows = []
    for name, r in results.items():
        t = r["tuned"]["no_cfg"]
        c = r["curves"]
        rows.append([f"{name}, no CFG (finished)", f"{c['rollout_images'][-1]:.0f}",
                     f"{c['seconds'][-1] / 60:.1f}", f"{t['shapes_eval']:.3f}",
                     f"{t['all_correct']:.3f}", f"{t['artifact']:.3f}", "3"])  # fmt: skip
        curve_rows += _curve_rows(name, c)
    for name, c in partials.items():
        step, images, seconds, score, allc = last_eval(c)
        rows.append([f"{name}, no CFG (unfinished: after {step} of its iterations)",
                     f"{images:.0f}", f"{seconds / 60:.1f}", f"{score:.3f}", f"{allc:.3f}",
                     "", "1"])  # fmt: skip
        curve_rows += _curve_rows(name, c)
    headers = ["model", "rollout images", "RL minutes", "ShapesEval", "all correct",
               "artifact reward", "seeds"]  # fmt: skip
    s = RlStageSettings(**common)
    md = (
        "## RL without CFG on ShapesWorld (`benchmarks/rl_grpo_proof.py`)\n\n"
        f"The full demo's pretrained model; {cfg.eval.max_prompts} held-out prompts, "
        f"{s.eval_steps} Euler steps. Pool: {pool} of {s.max_train_prompts} training "
        f"prompts ({s.pool_samples} no-CFG samples each). Each iteration: "
        f"{s.prompts_per_step} prompts x {s.group_size} images, {s.sample_steps}-step "
        f"rollouts without CFG, rewards rubric + {s.artifact_weight} x artifact (GDPO), "
        f"lr {s.lr:g}, full fine-tuning. GRPO: SDE window {s.window_size} steps "
        f"(noise level {s.noise_level}), {s.inner_steps} inner steps, clip {s.clip}; "
        f"DiffusionNFT: beta {s.nft_beta}, ODE rollouts.\n\n"
        + table(headers, rows)
        + "\n\nShapesEval without CFG against rollout images and wall time (1 seed, the "
        "model after `step` updates):\n\n"
        + table(
            [
                "variant",
                "step",
                "rollout images",
                "RL minutes",
                "ShapesEval",
                "all correct",
                "artifact",
            ],
            curve_rows,
        )
        + f"\n\nCommand: `uv run --frozen python benchmarks/rl_grpo_proof.py --demo DIR "
        f"--variants {args.variants}"
        + (" --report-only`" if args.report_only else "`")
        + f" ({(time.perf_counter() - t0) / 60:.1f} min).\n"
    )
    summary = {"results": results, "partial": partials, "pretrained": pre, "pool": pool,
               "settings": common}  # fmt: skip
    print(md)
    write_results("rl-grpo-proof", summary, md)


def _curve_rows(name: str, c: dict) -> list[list[str]]:
    rows = []
    for i, v in enumerate(c["eval_shapes"]):
        if v is None:
            continue
        images = c["rollout_images"][i - 1] if i else 0.0
        seconds = c["seconds"][i - 1] if i else 0.0
        rows.append([name, str(c["step"][i]), f"{images:.0f}", f"{seconds / 60:.1f}",
                     f"{v:.3f}", f"{c['eval_all_correct'][i]:.3f}",
                     f"{c['eval_artifact'][i]:.3f}"])  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
