"""ShapesWorld proof of preference optimization, on the demo's own pretrained model: the
demo's preference stage (``krea2.rl.preference.preference_stage``) runs STPO and DPO from
the same start on the same on-policy pairs (training concepts' prompts, ranked by the
rubric + 0.5 x artifact reward) and compares them on the held-out prompts (ShapesEval, the
artifact reward, high-frequency energy relative to the pretrained model) and by their
likelihood-gap curves.

    uv run --frozen python benchmarks/rl_proof.py --demo DIR [--quick] [--work DIR]

``--demo DIR``: a ``krea2 demo --out DIR`` output whose pretraining finished (run with the
same ``--quick``); without one the script runs the demo's curation and pretraining there
first (~13 min quiet on 2 cores, ~3 with ``--quick``). Writes
benchmarks/results/rl-proof[-quick].json, the ``rl-proof[-quick]`` section of
docs/benchmarks.md and WORK/grids.png (rows: pretrained, STPO, DPO; first seed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

# Python puts this script's folder first on sys.path, where benchmarks/queue.py would shadow
# the standard library's queue; drop it and load report by path (as benchmarks/trainer.py).
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("report", HERE / "report.py")
_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_report)
table, write_results = _report.table, _report.write_results

from krea2.curate.shapes import concept_scene, eval_prompt, split_concepts  # noqa: E402
from krea2.rl.preference import (  # noqa: E402
    PreferenceStageSettings,
    preference_stage,
    shapes_preference_reward,
)

# The demo recipe's [preference] tables (docs/rl.md): full and --quick.
FULL = PreferenceStageSettings()
QUICK = PreferenceStageSettings(
    max_train_prompts=16, samples_per_prompt=4, sample_steps=8, sample_cfg=2.0,
    eval_seeds=[0], steps=6, batch_size=8, warmup_steps=2, log_every=1, checkpoint_every=0,
)  # fmt: skip

HEADERS = [
    "model",
    "ShapesEval",
    "artifact reward",
    "HF energy / pretrained",
    "winner gap (end)",
    "winner gap (max)",
    "loser gap (end)",
    "accuracy (end)",
]


def demo_job(demo: Path, quick: bool):
    """The demo's pretraining job in ``demo`` (run there first when not finished)."""
    from krea2.pipeline.config import load_demo_config, training_job

    cfg = load_demo_config(quick)
    dirs = [demo / "shards" / s.name for s in cfg.train.stages]
    job = training_job(cfg, demo / "run", dirs, [])
    last = job.stages[-1].name
    if not (demo / "run" / "checkpoints" / f"{last}.done").exists():
        from krea2.pipeline.demo import run_demo

        run_demo(demo, quick)
    return cfg, job


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--demo", type=Path, default=Path("/tmp/krea2-rl-proof/demo"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/krea2-rl-proof"))
    args = ap.parse_args()
    q = args.quick
    t0 = time.perf_counter()
    cfg, job = demo_job(args.demo, q)
    split = split_concepts(cfg.pool.seed, cfg.pool.held_out_fraction)
    held = list(split.held_out[: cfg.eval.max_prompts])
    train_prompts = [eval_prompt(c) for c in split.train]
    eval_prompts = [eval_prompt(c) for c in held]
    settings = QUICK if q else FULL
    settings.sample_steps, settings.sample_cfg = cfg.eval.steps, cfg.eval.cfg
    settings.eval_seeds = list(cfg.eval.seeds)
    work = args.work / ("quick" if q else "full")
    reward = shapes_preference_reward(work / "artifact.npz")
    results = {}
    for kind in ("stpo", "dpo"):
        results[kind] = preference_stage(
            job, len(job.stages) - 1, work, train_prompts, eval_prompts, reward, kind,
            settings, eval_targets=[concept_scene(c) for c in held],
        )  # fmt: skip
    total = time.perf_counter() - t0
    pre = results["stpo"]["pretrained"]
    rows = [["pretrained", f"{pre['shapes_eval']:.3f}", f"{pre['artifact']:.3f}", "1.000",
             "", "", "", ""]]  # fmt: skip
    for kind, r in results.items():
        c, t = r["curves"], r["tuned"]
        if not r["pairs"]:
            rows.append([kind.upper(), "no pair: not trained", "", "", "", "", "", ""])
            continue
        rows.append([
            kind.upper(), f"{t['shapes_eval']:.3f}", f"{t['artifact']:.3f}",
            f"{r['hf_energy_ratio']:.3f}", f"{c['winner_gap'][-1]:+.5f}",
            f"{max(c['winner_gap']):+.5f}", f"{c['loser_gap'][-1]:+.5f}",
            f"{c['accuracy'][-1]:.2f}",
        ])  # fmt: skip
    grids = [np.load(results["stpo"]["pretrained_samples"])[:8, 0]]
    grids += [np.load(results[k]["samples"])[:8, 0] for k in ("stpo", "dpo")]
    strip = np.concatenate([np.concatenate(list(g), axis=1) for g in grids], axis=0)
    Image.fromarray(strip).save(work / "grids.png")
    seconds = {k: r["seconds"] for k, r in results.items()}
    s = settings
    md = (
        "## Preference optimization on ShapesWorld (`benchmarks/rl_proof.py`)\n\n"
        f"The demo's {'quick' if q else 'full'} pretrained model "
        f"({sum(st.steps for st in job.stages)} steps), then its preference stage: "
        f"{results['stpo']['pairs']} on-policy pairs ({s.samples_per_prompt} samples per "
        f"prompt on {min(s.max_train_prompts, len(train_prompts))} training-concept prompts, "
        "best vs worst by rubric + 0.5 x artifact reward); STPO and DPO (beta "
        f"{s.beta:g}, lr {s.lr:g}, {s.steps} steps of {results['stpo']['batch_size']} images) "
        f"from the same start; {len(eval_prompts)} held-out prompts x {len(s.eval_seeds)} "
        "seeds. Gaps are e − e_ref (per-pixel velocity MSE; > 0: that image's likelihood "
        "fell), at the last logged step and the largest over the run. Artifact reward: "
        "1 − P(defect), higher is cleaner.\n\n"
        + table(HEADERS, rows)
        + f"\n\nWall time of the preference part: {total / 60:.1f} min "
        + json.dumps({k: {p: round(v) for p, v in d.items()} for k, d in seconds.items()})
        + ".\nCommand: `uv run --frozen python benchmarks/rl_proof.py --demo DIR"
        + (" --quick`." if q else "`.")
    )
    summary = {"results": results, "total_s": total, "quick": q}
    print(md)
    write_results("rl-proof-quick" if q else "rl-proof", summary, md)


if __name__ == "__main__":
    main()
