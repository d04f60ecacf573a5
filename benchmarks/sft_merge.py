"""Domain SFT and merging on ShapesWorld (report §4.3), on the demo's own pretrained model:
one LoRA SFT per domain and their merges (uniform, weighted, TIES, task arithmetic), scored
by a background-style classifier over samples and by ShapesEval.

    uv run --no-sync python -m benchmarks.sft_merge --demo DIR [--work DIR] [--seeds 0,1]
        [--steps 150] [--report-only]

``--demo DIR``: a full ``krea2 demo --out DIR`` whose pretraining finished. The SFT and
merge code is the demo stage's (krea2.pipeline.sft_merge; its module docstring says why
the domains look as they do): domain A owns the circles and gives them a maroon background,
domain B the squares on teal, colours the world never draws; each SFT set replays the
base's scenes of every concept it does not own; styles are measured on content prompts
(no background named) of each domain's concepts. The demo runs it with its [eval] seeds
(0, 1, 2: the same numbers as ``--seeds 0,1,2`` here); this script with ``--seeds``
(default 2) and writes the ``sft_merge`` section of
docs/benchmarks.md and benchmarks/results/sft_merge.json. The SFT runs resume under WORK
(``--report-only``: rewrite the section from WORK/result.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.report import table, write_results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, required=True, help="a finished krea2 demo --out DIR")
    p.add_argument("--work", type=Path, default=Path("/tmp/krea2-sft-merge"))
    p.add_argument("--seeds", default="0,1", help="sampling seeds (style and ShapesEval)")
    p.add_argument("--steps", type=int, default=0, help="SFT steps per domain (0: the demo's)")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()

    from krea2.pipeline import sft_merge, sft_merge_report
    from krea2.pipeline.config import demo_training_job, load_demo_config
    from krea2.pipeline.evaluation import demo_concepts

    cfg = load_demo_config(False)
    job, finished = demo_training_job(cfg, args.demo)
    if not finished:
        sys.exit(f"{args.demo} has no finished pretraining; run krea2 demo --out {args.demo}")
    split, held_out = demo_concepts(cfg)
    settings = replace(
        sft_merge.demo_settings(cfg), seeds=tuple(int(s) for s in args.seeds.split(","))
    )
    if args.steps:
        settings = replace(settings, steps=args.steps)
    saved = args.work / "result.json"
    if args.report_only:
        result = json.loads(saved.read_text())
    else:
        result = sft_merge.run_sft_merge(
            job, len(job.stages) - 1, args.work, list(split.train), held_out, settings
        )
        saved.write_text(json.dumps(result, indent=1))
    s = result["settings"]

    def counts(seen: dict[str, int]) -> str:
        return ", ".join(f"{c} {n}" for c, n in sorted(seen.items(), key=lambda x: -x[1]))

    seen = "; ".join(
        f"{name}: " + " / ".join(counts(m["styles_seen"][d]) for d in sft_merge.DOMAINS)
        for name, m in result["models"].items()
    )
    md = "\n".join([
        "## Domain SFT and merging on ShapesWorld (`benchmarks/sft_merge.py`)",
        "",
        f"The full demo's pretrained model (64 px). Domain A owns the circles (its set: circles "
        f"on maroon), domain B the squares (on teal), colours the world never draws; each set "
        f"holds {s.get('own_factor', 2)} x as many renders of each of its own concepts as it "
        f"replays of every concept it does not own (the base's black / dark gray), captions "
        f"with the content prompt (no background named) as "
        f"the short format. LoRA r{s['rank']}, {s['steps']} SFT steps per domain at lr "
        f"{s['lr']:g}, batch {s['batch_size']}. Style columns: share of samples whose "
        f"background (median pixel -> nearest named colour) is the domain's style, on "
        f"{s['style_prompts']} content prompts of that domain x {len(s['seeds'])} seeds "
        f"({s['sample_steps']} steps, CFG {s['cfg']:g}); ShapesEval on the {len(held_out)} "
        f"held-out concepts on black (every shape, same seeds), in brackets the difference "
        f"to the base on the same prompts and seeds ± its standard error over the prompts. "
        f"SFT and sampling "
        f"{result['seconds'] / 60:.1f} min on 2 CPU cores.",
        "",
        table(sft_merge_report.HEADERS, sft_merge_report.rows(result)),
        "",
        f"What the classifier saw (domain A's prompts / domain B's): {seen}.",
        "",
        f"Command: `uv run --no-sync python -m benchmarks.sft_merge --demo DIR --seeds "
        f"{args.seeds}`{' --steps ' + str(args.steps) if args.steps else ''} "
        f"({result['seconds'] / 60:.1f} min).",
    ])  # fmt: skip
    kept = {k: v for k, v in result.items() if k != "samples"}  # no machine paths
    write_results("sft_merge", {"args": {"seeds": args.seeds, "steps": args.steps},
                                "result": kept}, md)  # fmt: skip
    print(md)


if __name__ == "__main__":
    main()
