"""The style module's designs on a finished demo's raw model: the recipe's (tokens at the
text's RoPE position) against the spatial path (`pool = "tiles"`, `cross`; docs/dit.md),
each trained as the demo's style stage trains its variants and measured on its held-out
cases x `[eval]` seeds, paired with the demo's own S (style) and its samples without a
reference (content).

    uv run --no-sync python -m benchmarks.style_spatial --demo DIR
        [--variants 'variant=S' 'variant=S;pool=tiles;tokens=16;cross=4;tiles=1' ...]
        [--work DIR] [--report-only] [--note TEXT]

A variant is `key=value;...`: `variant` (R, S or O), `steps`, `uncaptioned` (the share of
training scenes with an object no caption names) and any field of
`krea2.trainer.StyleSettings` (`pool`, `cross`, `tokens`, `tiles`, `reference`, ...); the
rest is the demo's recipe. Writes the `style_spatial` section of docs/benchmarks.md and
benchmarks/results/style_spatial.json; runs resume under WORK.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from benchmarks.report import parse_settings, settings_text, table, write_results

DEFAULT_VARIANTS = [
    "variant=S",
    "variant=R;uncaptioned=0.5",
    "variant=S;pool=tiles;tokens=16;cross=4;tiles=1",
    "variant=O;pool=tiles;tokens=16;cross=4",
    "variant=R;pool=tiles;tokens=16;cross=4",
    "variant=R;pool=tiles;tokens=16;cross=4;uncaptioned=0.5",
    "variant=S;pool=tiles;tokens=16;cross=4;tiles=1;uncaptioned=0.5",
]
STAGE_KEYS = ("variant", "steps", "uncaptioned")


def split_variant(changes: dict) -> tuple[str, dict, dict]:
    """(letter, stage changes, module changes) of one parsed variant; SystemExit naming an
    unknown key."""
    from krea2.trainer import StyleSettings

    module_keys = {f.name for f in fields(StyleSettings)}
    unknown = set(changes) - module_keys - set(STAGE_KEYS)
    if unknown:
        sys.exit(f"unknown variant key {sorted(unknown)[0]!r}: use {STAGE_KEYS} or "
                 f"StyleSettings fields {sorted(module_keys)}")  # fmt: skip
    letter = str(changes.get("variant", "S"))
    if letter not in ("R", "S", "O"):
        sys.exit(f"variant={letter!r} must be R, S or O")
    stage = {k: changes[k] for k in ("steps", "uncaptioned") if k in changes}
    module = {k: v for k, v in changes.items() if k in module_keys}
    return letter, stage, module


def measure(text: str, cfg, raw, split, cases, refs, csd, base: dict, work: Path) -> dict:
    """Train one variant (or find it trained under ``work``) and measure it."""
    from krea2.pipeline.evaluation import paired_delta
    from krea2.pipeline.style_stage import Sampler, per_image_measures, train_variants

    letter, stage, module = split_variant(parse_settings(text))
    s = cfg.style
    s = replace(s, variants=[letter], **stage, module=replace(s.module, **module))
    start = time.perf_counter()
    trained = train_variants(s, raw, work, list(split.train))
    sampler = Sampler(trained["models"][letter], list(cfg.eval.seeds), cfg.eval.steps)
    images = sampler(work / "samples.npy", [c.prompt for c in cases], refs, [[1.0]] * len(cases))
    m = per_image_measures(images, cases, csd)
    row = {"variant": text, "seconds": time.perf_counter() - start}
    for key in ("similarity", "kind", "colour", "csd", "leaked", "content"):
        row[key] = float(np.mean(m[key]))
    for key in ("similarity", "kind", "colour", "csd"):
        row[f"{key}_vs_S"] = paired_delta(m[key], base["S"][key])
    row["content_vs_none"] = paired_delta(m["content"], base["none"])
    row["gradient_reads"] = gradient_reads(images, cases)
    return row


def gradient_reads(images: np.ndarray, cases: list) -> list[int]:
    """[outputs read as a gradient, outputs] over the cases whose reference is one."""
    from krea2.curate.shapes import read_style

    side = images.shape[2]
    hits = total = 0
    for case, row in zip(cases, images, strict=True):
        if read_style(case.reference_pixels(side)).background.kind != "gradient":
            continue
        hits += sum(read_style(img).background.kind == "gradient" for img in row)
        total += len(row)
    return [hits, total]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, required=True, help="a finished krea2 demo --out DIR")
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="each k=v;k=v")
    p.add_argument("--work", type=Path, default=Path("/tmp/krea2-style-spatial"))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--note", default="", help="a sentence for the section (the run's machine)")
    args = p.parse_args()
    for text in args.variants:  # every variant checked before any training
        split_variant(parse_settings(text))

    from krea2.curate.shapes import StyleEncoder, shapes_eval
    from krea2.pipeline.chain import load_model
    from krea2.pipeline.config import load_demo_config
    from krea2.pipeline.evaluation import demo_concepts
    from krea2.pipeline.style_data import style_cases
    from krea2.pipeline.style_stage import per_image_measures
    from krea2.trainer import encode_images

    cfg = load_demo_config(False)
    style_dir, rl_file = args.demo / "style", args.demo / "stages" / "rl.json"
    if not (style_dir / "S-s1.0.npy").is_file() or not rl_file.is_file():
        sys.exit(f"{args.demo} has no finished style stage; run krea2 demo --out {args.demo}")
    saved = args.work / "result.json"
    if args.report_only:
        result = json.loads(saved.read_text())
    else:
        split, held = demo_concepts(cfg)
        s = cfg.style
        cases = style_cases(held, list(split.train), s.eval_cases, s.seed + 1,
                            tuple(s.object_styles))  # fmt: skip
        raw = load_model(json.loads(rl_file.read_text())["result"]["model"])
        csd = StyleEncoder.load(style_dir / "csd")
        refs = encode_images(raw[0], np.stack([c.reference_pixels(64) for c in cases]))[:, None]
        prompts = [c.prompt for c in cases]
        base = {
            "S": per_image_measures(np.load(style_dir / "S-s1.0.npy"), cases, csd),
            "none": shapes_eval(np.load(style_dir / "none.npy"), prompts).per_image,
        }
        # a variant found finished under WORK keeps the seconds its first run took
        before = json.loads(saved.read_text())["rows"] if saved.is_file() else []
        took = {r["variant"]: r["seconds"] for r in before}
        rows = []
        for i, text in enumerate(args.variants):
            work = args.work / f"{i:02d}-{text.replace(';', '_').replace('=', '')}"
            reused = (work / "samples.npy").is_file()
            rows.append(measure(text, cfg, raw, split, cases, refs, csd, base, work))
            if reused and text in took:
                rows[-1]["seconds"] = took[text]
            print(json.dumps(rows[-1]), flush=True)
        result = {"rows": rows, "seconds": sum(r["seconds"] for r in rows),
                  "cases": len(cases), "seeds": len(cfg.eval.seeds)}  # fmt: skip
        args.work.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(result, indent=1))

    def d(x: dict) -> str:
        return f"{x['delta']:+.3f} ± {x['se']:.3f}"

    def vs(r: dict, key: str, base: str = "S") -> str:
        return f"{r[key]:.3f} ({d(r[f'{key}_vs_{base}'])})"

    headers = ["variant", "similarity (vs the demo's S)", "kind (vs S)", "colour (vs S)",
               "toy CSD (vs S)", "gradients drawn", "leaks",
               "ShapesEval (vs no reference)"]  # fmt: skip
    body = [[f"`{r['variant']}`", vs(r, "similarity"), vs(r, "kind"), vs(r, "colour"),
             vs(r, "csd"), f"{r['gradient_reads'][0]} of {r['gradient_reads'][1]}",
             f"{r['leaked']:.1%}", vs(r, "content", "none")]
            for r in result["rows"]]  # fmt: skip
    md = "\n".join([
        "## Style module designs on the demo's raw (`benchmarks/style_spatial.py`)",
        "",
        f"Each variant trained as the demo's style stage trains its variants (the recipe's "
        f"settings but for the ones named) on the full demo's raw model, then sampled on the "
        f"stage's {result['cases']} held-out cases x {result['seeds']} seeds at strength 1; "
        f"deltas paired with the demo's own S and, for ShapesEval, with raw's samples "
        f"without a reference (± the standard error over cases). `pool=tiles;cross=K` is "
        f"the spatial path (docs/dit.md); `uncaptioned` the share of training scenes with "
        f"an object no caption names (what R can only fit by copying the reference). "
        f"Gradients drawn: outputs read as a gradient among those whose reference is one. "
        f"{result['seconds'] / 60:.1f} min on 2 CPU cores. {args.note}",
        "",
        table(headers, body),
        "",
        "Command: `uv run --no-sync python -m benchmarks.style_spatial --demo DIR --variants "
        + " ".join(f"'{settings_text(parse_settings(r['variant']))}'" for r in result["rows"])
        + "`.",
    ])  # fmt: skip
    write_results("style_spatial", {"args": {"variants": args.variants}, "result": result}, md)
    print(md)


if __name__ == "__main__":
    main()
