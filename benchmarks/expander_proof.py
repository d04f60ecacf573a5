"""ShapesWorld proof of the prompt expander (issue: expander), on the demo's own pretrained
DiT: the demo's expander stage (``krea2.pipeline.expander_stage``: SFT, GDPO with the
diversity reward, GDPO without it) with the full recipe's ``[expander]`` settings,
measured on short requests for the held-out concepts — faithfulness of the greedy
expansions, ShapesEval of the DiT's images against the request (raw request vs expansion),
and intra-group image diversity of sampled expansions.

    uv run --frozen python -m benchmarks.expander_proof --demo DIR [--work DIR]
        [--set key=value ...]

``--demo DIR``: a full ``krea2 demo --out DIR`` whose pretraining finished. The proof's
budget (`PROOF`) is larger than the demo recipe's; ``--set`` changes any ``[expander]``
field on top of it (``--set sft_steps=1200``). The run resumes under WORK.
Writes benchmarks/results/expander-proof.json and the ``expander-proof`` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.report import table, write_results

# The proof's budget on top of the full recipe's [expander] (which is sized for the demo's
# time limit): twice the held-out requests, a wider toy Qwen3 (192), longer SFT and GDPO;
# GDPO's image reward is the rubric alone (the measured proof ran before the artifact
# reward joined the demo's stage; --set artifact_weight=0.5 adds it).
PROOF = {"requests_per_concept": 2, "sft_steps": 1500, "gdpo_steps": 80, "toy.hidden": 192,
         "toy.intermediate": 576, "artifact_weight": 0.0}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", type=Path, required=True, help="a full demo's --out folder")
    p.add_argument("--work", type=Path, default=Path("expander-proof"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()

    from krea2.pipeline import evaluation, expander_stage
    from krea2.pipeline.config import demo_training_job, load_demo_config

    settings = [f"{k}={v}" for k, v in PROOF.items()] + args.overrides
    cfg = load_demo_config(False, overrides=[f"expander.{o}" for o in settings])
    job, finished = demo_training_job(cfg, args.demo)
    if not finished:
        demo = args.demo
        raise SystemExit(f"{demo} has no finished pretraining; run krea2 demo --out {demo}")
    _, held_out = evaluation.demo_concepts(cfg)
    t0 = time.perf_counter()
    result = expander_stage.run_demo_stage(cfg, job, args.work, held_out)
    # Wall time over every invocation on WORK (a rerun resumes and adds only its own).
    record = args.work / "proof-wall.json"
    before = json.loads(record.read_text())["seconds"] if record.is_file() else 0.0
    wall = before + time.perf_counter() - t0
    record.write_text(json.dumps({"seconds": wall}))
    models = result["models"]
    sft_div = models["sft"]["diversity"]
    ratios = {n: m["diversity"] / sft_div for n, m in models.items() if sft_div > 0}
    curves = result["curves"]
    curve_rows = []
    for run, c in curves.items():
        n = len(c["step"])
        q = max(1, n // 4)
        for label, part in (("first", slice(0, q)), ("last", slice(n - q, n))):
            steps = c["step"][part]
            cells = []
            for key in ("faithfulness", "rubric", "diversity"):
                values = [v for v in (c.get(key) or [])[part] if v is not None]
                cells.append(f"{sum(values) / len(values):.3f}" if values else "")
            curve_rows.append([expander_stage.LABELS.get(run, run),
                               f"{label} {q} ({steps[0]}-{steps[-1]})", *cells])  # fmt: skip
    s = result["settings"]
    md = [
        "## Prompt expander proof (`benchmarks/expander_proof.py`)",
        "",
        f"{len(result['requests'])} short requests for the demo's held-out concepts "
        f"({s['requests_per_concept']} each), rendered by the full demo's pretrained 64 px DiT "
        f"({s['eval_steps']} steps, CFG {s['eval_cfg']}, seeds {s['eval_seeds']}); the rubric "
        "scores each image against the request. SFT: a toy Qwen3 "
        f"({s['toy']['layers']} layers × {s['toy']['hidden']}) from scratch, "
        f"{s['sft_steps']} steps × {s['sft_batch']} on {result['sft_examples']} requests "
        f"written from the shards' scenes; GDPO: {s['gdpo_steps']} steps × {s['gdpo_prompts']} "
        f"requests × {s['group']} expansions, lr {s['gdpo_lr']}.",
        "",
        table(expander_stage.HEADERS, expander_stage.rows(result)),
        "",
        "Intra-group diversity relative to the SFT model: "
        + ", ".join(f"{expander_stage.LABELS.get(n, n)} {r:.2f}×" for n, r in ratios.items())
        + ".",
        "",
        "GDPO rollouts' rewards (means over the first and the last quarter of the steps; "
        "each step is a batch of 16 rollouts, so single steps are noisy):",
        "",
        table(["run", "steps", "faithfulness", "rubric", "diversity"], curve_rows),
        "",
        f"Wall time {wall / 60:.1f} min over every invocation on the work folder, on 2 CPU "
        "cores shared with other jobs (one torch thread).",
    ]
    summary = expander_stage.summary(result)
    write_results("expander-proof", {"summary": summary, "curves": curves,
                                     "diversity_vs_sft": ratios, "wall_s": wall},
                  "\n".join(md))  # fmt: skip
    print("\n".join(md))


if __name__ == "__main__":
    main()
