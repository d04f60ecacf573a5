"""The chain's SFT step against its settings, first the replay share of the shapes no
domain owns: for each variant (an ``unowned_factor``, or any fields of
krea2.pipeline.sft_merge.SftMergeSettings) the two domain SFTs of the demo's recipe, their
merge as the chain takes it (``chain_merge``), and that model's
ShapesEval on the demo's held-out prompts with every ``[eval]`` seed, with CFG and without,
paired with the demo's own pretrained samples (the chain stage's), per shape too.

    uv run --no-sync python -m benchmarks.sft_replay --demo DIR
        [--variants 1 3 'unowned_factor=3;lr=2e-3'] [--work DIR] [--report-only]

``--demo DIR``: a full ``krea2 demo --out DIR`` whose ``chain`` stage finished (its
pretrained model and samples are the base and the yardstick). Factor 1 is the recipe of that
run when it was made with ``unowned_factor = 1``: its CFG numbers then equal the chain
table's ``sft`` row. Writes the ``sft_replay`` section of docs/benchmarks.md and
benchmarks/results/sft_replay.json; the SFT runs resume under WORK (``--report-only``:
rewrite the section from WORK/result.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.report import table, write_results

SHAPES = ("circle", "square", "triangle")


def parse_variant(text: str) -> dict[str, float]:
    """``"unowned_factor=3;lr=2e-3"`` -> settings to replace (a bare number: the factor)."""
    if "=" not in text:
        return {"unowned_factor": int(text)}
    pairs = (kv.split("=", 1) for kv in text.split(";") if kv)
    return {k: (int(v) if v.isdigit() else float(v)) for k, v in pairs}


def measure_variant(cfg, job, index: int, work: Path, train, held_out, changes: dict,
                    base: dict) -> dict:  # fmt: skip
    """One variant's merged SFT (the demo's settings with ``changes``) measured against
    ``base`` (the chain's pretrained row), and its style shares on 3 seeds."""
    from krea2.curate.shapes import concept_scene, eval_prompt, shapes_eval
    from krea2.infra.atomic import cached_array
    from krea2.pipeline import sft_merge
    from krea2.pipeline.chain import adopt_merge
    from krea2.pipeline.evaluation import paired_delta
    from krea2.trainer import load_stage_module, sample_module

    s = replace(sft_merge.demo_settings(cfg), **changes)
    work.mkdir(parents=True, exist_ok=True)
    files = sft_merge.domain_sfts(job, index, work, train, s)
    # the merge the chain takes, adopted as a stage as the demo does
    job = adopt_merge(job, index, work, s, files)
    index = len(job.stages) - 1
    module = load_stage_module(job, index)
    ev = cfg.eval
    prompts = [eval_prompt(c) for c in held_out]
    scenes = [concept_scene(c) for c in held_out]
    row: dict = {"variant": changes}
    for domain, (_, style) in sft_merge.DOMAINS.items():
        styles = sft_merge.style_prompts(train, domain, s.style_prompts)
        imgs = sample_module(job, index, module, styles, list(ev.seeds[:3]), ev.steps, ev.cfg)
        seen = [sft_merge.background_style(im) for per_prompt in imgs for im in per_prompt]
        row[f"style_{domain}"] = sum(x == style for x in seen) / len(seen)
    for key, scale in (("cfg", ev.cfg), ("no_cfg", 0.0)):
        images = cached_array(work / f"{key}.npy", lambda scale=scale: sample_module(
            job, index, module, prompts, list(ev.seeds), ev.steps, scale))  # fmt: skip
        per = shapes_eval(images, scenes).per_image
        d = paired_delta(per, base[key]["per_image"])
        by_shape = {}
        for shape in SHAPES:
            rows = [i for i, c in enumerate(held_out) if c[1] == shape]
            before = base[key]["per_image"]
            by_shape[shape] = [float(np.mean([per[i] for i in rows])),
                               float(np.mean([before[i] for i in rows]))]  # fmt: skip
        row[key] = {"shapes_eval": float(np.mean(per)), "delta": d["delta"], "se": d["se"],
                    "by_shape": by_shape}  # fmt: skip
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, required=True, help="a finished krea2 demo --out DIR")
    p.add_argument("--variants", nargs="+", default=["1", "2", "3"],
                   help="each: an unowned_factor, or settings as k=v;k=v")  # fmt: skip
    p.add_argument("--work", type=Path, default=Path("/tmp/krea2-sft-replay"))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--note", default="", help="a sentence for the section (the run's machine)")
    args = p.parse_args()

    from krea2.pipeline.config import demo_training_job, load_demo_config
    from krea2.pipeline.evaluation import demo_concepts

    cfg = load_demo_config(False)
    job, finished = demo_training_job(cfg, args.demo)
    chain_file = args.demo / "stages" / "chain.json"
    if not finished or not chain_file.is_file():
        sys.exit(f"{args.demo} has no finished chain stage; run krea2 demo --out {args.demo}")
    base = json.loads(chain_file.read_text())["result"]["models"]["pretrained"]
    split, held_out = demo_concepts(cfg)
    saved = args.work / "result.json"
    if args.report_only:
        result = json.loads(saved.read_text())
    else:
        start, rows = time.perf_counter(), []
        for text in args.variants:
            changes = parse_variant(text)
            name = "-".join(f"{k}{v}" for k, v in changes.items())
            rows.append(measure_variant(cfg, job, len(job.stages) - 1, args.work / name,
                                        list(split.train), held_out, changes, base))  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        result = {"rows": rows, "variants": args.variants, "seconds": time.perf_counter() - start,
                  "base": {k: base[k]["shapes_eval"] for k in ("cfg", "no_cfg")}}  # fmt: skip
        args.work.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(result, indent=1))

    def cell(m: dict) -> str:
        return f"{m['shapes_eval']:.3f} ({m['delta']:+.3f} ± {m['se']:.3f})"

    def name(r: dict) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in r["variant"].items())

    headers = ["SFT settings", "style A", "style B", "ShapesEval, CFG (vs pretrained)",
               "triangles, CFG", "ShapesEval, no CFG (vs pretrained)",
               "triangles, no CFG"]  # fmt: skip

    def share(r: dict, d: str) -> str:  # rows measured before the style columns: "-"
        return f"{r[f'style_{d}']:.2f}" if f"style_{d}" in r else "-"

    body = [[name(r), share(r, "A"), share(r, "B"), cell(r["cfg"]),
             f"{r['cfg']['by_shape']['triangle'][0]:.3f}", cell(r["no_cfg"]),
             f"{r['no_cfg']['by_shape']['triangle'][0]:.3f}"] for r in result["rows"]]  # fmt: skip
    b = result["base"]
    tri = {k: result["rows"][0][k]["by_shape"]["triangle"][1] for k in ("cfg", "no_cfg")}
    ev = cfg.eval
    md = "\n".join([
        "## The SFT step against the replay of unowned shapes (`benchmarks/sft_replay.py`)",
        "",
        f"The full demo's pretrained model (ShapesEval {b['cfg']:.3f} with CFG {ev.cfg:g}, "
        f"{b['no_cfg']:.3f} without; triangles {tri['cfg']:.3f} / {tri['no_cfg']:.3f}), the "
        f"demo's two domain SFTs with the renders of every concept no domain owns (the "
        f"triangles) replayed `unowned_factor` x as often in both sets, merged as the chain "
        f"merges them; {len(held_out)} held-out prompts x {len(ev.seeds)} seeds at "
        f"{ev.steps} steps, paired with the pretrained model's samples (± the standard error "
        f"over prompts). Style columns: the share of samples in the domain's style on its "
        f"content prompts ({ev.seeds[:3]} seeds, CFG {ev.cfg:g}). The other settings are "
        f"the recipe's. {result['seconds'] / 60:.1f} min on 2 CPU cores. {args.note}",
        "",
        table(headers, body),
        "",
        "Command: `uv run --no-sync python -m benchmarks.sft_replay --demo DIR --variants "
        + " ".join(f"'{v}'" for v in result["variants"]) + "`.",
    ])  # fmt: skip
    write_results("sft_replay", {"args": {"variants": args.variants}, "result": result}, md)
    print(md)


if __name__ == "__main__":
    main()
