"""The chain's RL step against its settings: for each variant (any fields of
krea2.rl.online.RlStageSettings or its GrpoConfig, flat) the demo's `rl` stage rerun from
the demo's own PO model (the STPO stage's), measured as the chain measures raw: ShapesEval
without CFG on the held-out prompts with every ``[eval]`` seed, paired with the chain's
pretrained model with CFG (the must-show "raw without CFG >= pretrained with CFG") and
with the PO model without CFG (what RL added).

    uv run --no-sync python -m benchmarks.rl_replay --demo DIR
        [--variants '' 'micro_batch=64' 'steps=150;micro_batch=64'] [--work DIR]
        [--note TEXT] [--report-only]

``--demo DIR``: a full ``krea2 demo --out DIR`` whose ``chain`` stage finished. The empty
variant is the demo's own recipe. The variants share one prompt pool (curated once from
the PO model's samples) under WORK; each run resumes under WORK/NAME. Writes the
``rl_replay`` section of docs/benchmarks.md and benchmarks/results/rl_replay.json
(``--report-only``: rewrite the section from WORK/result.json).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks.report import parse_settings, settings_text, table, write_results


def variant_name(changes: dict) -> str:
    """The run directory's name: the settings' text, safe as a file name."""
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", settings_text(changes)) or "recipe"


def run_variant(cfg, demo: Path, work: Path, changes: dict, base: dict) -> dict:
    """One variant's RL run from the demo's PO model, measured against ``base`` (the chain's
    models: ``pretrained`` with CFG, ``po`` without)."""
    from krea2.curate.shapes import concept_scene, eval_prompt, shapes_eval
    from krea2.pipeline.chain import load_model
    from krea2.pipeline.evaluation import demo_concepts, paired_delta
    from krea2.rl.online import rl_stage, settings_with

    po = json.loads((demo / "stages" / "preference-stpo.json").read_text())["result"]
    job, index = load_model(po["model"])
    split, held_out = demo_concepts(cfg)
    ev = cfg.eval
    start = dict(asdict(cfg.rl), eval_steps=ev.steps, eval_cfg=ev.cfg, eval_seeds=list(ev.seeds))
    s = settings_with(start, changes)
    name = variant_name(changes)
    t0 = time.perf_counter()
    result = rl_stage(
        job, index, work, [eval_prompt(c) for c in split.train],
        [eval_prompt(c) for c in held_out], [concept_scene(c) for c in held_out], s,
        name=name, start_samples={k: Path(base["po"][k]["samples"]) for k in ("cfg", "no_cfg")},
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    tuned = np.load(result["tuned"]["no_cfg"]["samples"])
    per = shapes_eval(tuned, [concept_scene(c) for c in held_out]).per_image
    vs_pre = paired_delta(per, base["pretrained"]["cfg"]["per_image"])
    vs_po = paired_delta(per, base["po"]["no_cfg"]["per_image"])
    c = result["curves"]
    evals = [(st, round(v, 3)) for st, v in zip(c["step"], c["eval_shapes"], strict=True)
             if v is not None]  # fmt: skip
    return {
        "name": name, "changes": changes, "shapes_eval": float(np.mean(per)),
        "all_correct": result["tuned"]["no_cfg"]["all_correct"],
        "bg_noise": result["tuned"]["no_cfg"].get("bg_noise"),
        "vs_pretrained_cfg": vs_pre, "vs_po": vs_po, "curve": evals,
        "stopped": result["stopped"], "seconds": seconds,
        "train_seconds": result["seconds"].get("train"),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, required=True, help="a finished krea2 demo --out DIR")
    p.add_argument("--variants", nargs="+", default=[""], help="each: k=v;k=v ('' the recipe)")
    p.add_argument("--work", type=Path, default=Path("/tmp/krea2-rl-replay"))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--note", default="", help="a sentence for the section (the run's machine)")
    args = p.parse_args()

    from krea2.pipeline.config import load_demo_config

    cfg = load_demo_config(False)
    chain_file = args.demo / "stages" / "chain.json"
    if not chain_file.is_file():
        sys.exit(f"{args.demo} has no finished chain stage; run krea2 demo --out {args.demo}")
    base = json.loads(chain_file.read_text())["result"]["models"]
    saved = args.work / "result.json"
    if args.report_only:
        result = json.loads(saved.read_text())
    else:
        old = json.loads(saved.read_text())["rows"] if saved.is_file() else []
        rows = {r["name"]: r for r in old}
        for text in args.variants:
            row = run_variant(cfg, args.demo, args.work, parse_settings(text), base)
            rows[row["name"]] = row
            print(json.dumps(row), flush=True)
            args.work.mkdir(parents=True, exist_ok=True)
            result = {"rows": list(rows.values()),
                      "base": {"pretrained_cfg": base["pretrained"]["cfg"]["shapes_eval"],
                               "po_no_cfg": base["po"]["no_cfg"]["shapes_eval"],
                               "raw_no_cfg": base["raw"]["no_cfg"]["shapes_eval"]}}  # fmt: skip
            saved.write_text(json.dumps(result, indent=1))

    def delta(d: dict) -> str:
        return f"{d['delta']:+.3f} ± {d['se']:.3f}"

    headers = ["RL settings", "ShapesEval, no CFG", "vs pretrained CFG", "vs PO no CFG",
               "all correct", "background noise", "held-out curve (1 seed)",
               "RL seconds"]  # fmt: skip
    body = [[settings_text(r["changes"]).replace(";", ", ") or "the recipe",
             f"{r['shapes_eval']:.3f}", delta(r["vs_pretrained_cfg"]), delta(r["vs_po"]),
             f"{r['all_correct']:.3f}", f"{r['bg_noise']:.2f}" if r["bg_noise"] else "",
             " ".join(f"{v:.2f}" for _, v in r["curve"]),
             f"{r['train_seconds']:.0f}"] for r in result["rows"]]  # fmt: skip
    b, ev = result["base"], cfg.eval
    md = "\n".join([
        "## The chain's RL step against its settings (`benchmarks/rl_replay.py`)",
        "",
        f"The `rl` stage rerun from one full demo's PO model (ShapesEval without CFG "
        f"{b['po_no_cfg']:.3f}; the demo's own raw {b['raw_no_cfg']:.3f}; its pretrained "
        f"model with CFG {ev.cfg:g}: {b['pretrained_cfg']:.3f}), each row the recipe's `[rl]` "
        f"with the changes named; {len(ev.seeds)} seeds x the held-out prompts at "
        f"{ev.steps} steps without CFG, paired (± the standard error over prompts) with the "
        f"pretrained model with CFG and with the PO model without. One run per row: the "
        f"stage's seed-to-seed band is about ±0.06 (docs/design/rl.md). {args.note}",
        "",
        table(headers, body),
        "",
        "Command: `uv run --no-sync python -m benchmarks.rl_replay --demo DIR --variants "
        + " ".join(f"'{settings_text(r['changes'])}'" for r in result["rows"]) + "`.",
    ])  # fmt: skip
    write_results("rl_replay", {"result": result}, md)
    print(md)


if __name__ == "__main__":
    main()
