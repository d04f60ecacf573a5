"""ShapesWorld proof of preference optimization, on the demo's own pretrained model: the
demo's preference stage (``krea2.rl.preference.preference_stage``) runs STPO and DPO from
the same start on the same on-policy pairs (training concepts' prompts, ranked by the
rubric + 0.5 x artifact reward) and compares them on the held-out prompts (ShapesEval, the
artifact reward, high-frequency energy relative to the pretrained model) and by their
likelihood-gap curves. The stage's code, settings (the recipe's ``[preference]`` table)
and work layout are the demo's own (``krea2.pipeline.preference``); only the work directory
differs.

    uv run --frozen python -m benchmarks.rl_proof --demo DIR [--quick] [--work DIR]

``--demo DIR``: a ``krea2 demo --out DIR`` output whose pretraining finished (run with the
same ``--quick``); without one the script runs the whole demo there first (~16 min quiet on
2 cores, 1-3 with ``--quick``; its own preference stages, under DIR/preference, are this
same computation). Writes
benchmarks/results/rl-proof[-quick].json, the ``rl-proof[-quick]`` section of
docs/benchmarks.md and WORK/grids.png (rows: pretrained, STPO, DPO; first seed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.report import table, write_results
from krea2.pipeline import evaluation, preference


def demo_job(demo: Path, quick: bool):
    """The demo's pretraining job in ``demo`` (run there first when not finished)."""
    from krea2.pipeline.config import demo_training_job, load_demo_config

    cfg = load_demo_config(quick)
    job, finished = demo_training_job(cfg, demo)
    if not finished:
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
    split, held = evaluation.demo_concepts(cfg)
    work = args.work / ("quick" if q else "full")
    results = {
        kind: preference.run_objective(cfg, job, work, kind, list(split.train), held)
        for kind in preference.OBJECTIVES
    }
    total = time.perf_counter() - t0
    rows = preference.comparison_rows(results)
    grids = [images for _, images in preference.first_seed_rows(results)]
    strip = np.concatenate([np.concatenate(list(g), axis=1) for g in grids], axis=0)
    Image.fromarray(strip).save(work / "grids.png")
    seconds = {k: r["seconds"] for k, r in results.items()}
    s = cfg.preference  # the recipe's [preference] table, sampling as its [eval]
    md = (
        f"## Preference optimization on ShapesWorld{', quick demo model' if q else ''} "
        "(`benchmarks/rl_proof.py`)\n\n"
        f"The demo's {'quick' if q else 'full'} pretrained model "
        f"({sum(st.steps for st in job.stages)} steps), then its preference stage: "
        f"{results['stpo']['pairs']} on-policy pairs ({s.samples_per_prompt} samples per "
        f"prompt on {min(s.max_train_prompts, len(split.train))} training-concept prompts, "
        "best vs worst by rubric + 0.5 x artifact reward); STPO and DPO (beta "
        f"{s.beta:g}, lr {s.lr:g}, {s.steps} steps of {results['stpo']['batch_size']} images) "
        f"from the same start; {len(held)} held-out prompts x {len(s.eval_seeds)} "
        "seeds. Gaps are e − e_ref (per-pixel velocity MSE; > 0: that image's likelihood "
        "fell), at the last logged step and the largest over the run. Artifact reward: "
        "1 − P(defect), higher is cleaner.\n\n"
        + table(preference.HEADERS, rows)
        + f"\n\nWall time of the preference part: {total / 60:.1f} min "
        + json.dumps({k: {p: round(v) for p, v in d.items()} for k, d in seconds.items()})
        + ".\nCommand: `uv run --frozen python -m benchmarks.rl_proof --demo DIR"
        + (" --quick`." if q else "`.")
    )
    summary = {"results": results, "total_s": total, "quick": q}
    print(md)
    write_results("rl-proof-quick" if q else "rl-proof", summary, md)


if __name__ == "__main__":
    main()
