"""Why preference optimization lowers a strong model: PO variants from a demo's SFT model.

Every variant starts from the chain's SFT model of a finished full demo (``--demo DIR``,
``krea2 demo --out DIR``) and trains STPO with the demo's ``[preference]`` settings with
one or two of them changed (``--variant NAME:key=value,key=value``; the defaults below are
the ablation of docs/rl.md). Variants that keep the demo's pair settings reuse its pairs
(``DIR/preference``); the others sample their own. Each tuned model and the SFT model are
sampled on the held-out prompts × ``--seeds`` with CFG 3 and without CFG; reported:
ShapesEval of each, its paired difference to the SFT model ± the standard error over the
prompts, and the samples' high-frequency energy against the SFT model's (the drift).

Run from the root after a full demo: ``uv run --frozen python -m benchmarks.po_ablation
--demo DIR`` (about 1 min per variant on 2 idle cores). Writes
benchmarks/results/po-ablation.json and the ``po-ablation`` section of docs/benchmarks.md;
the work (runs, samples) stays under ``--work`` (default ``DIR/po-ablation``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from benchmarks.report import table, write_results

VARIANTS = [
    "recipe-then:lr=1e-4",
    "pairs-without-cfg:lr=1e-4,sample_cfg=0",
    "beta-20000:lr=1e-4,beta=20000",
    "caption-dropout:lr=1e-4,caption_dropout=0.2",
    "50-steps:lr=1e-4,steps=50",
    "lr-3e-5:lr=3e-5",
    "lr-3e-5-other-pairs:lr=3e-5,pair_seed=2000",
    "lr-3e-5-caption-dropout:lr=3e-5,caption_dropout=0.2",
]
PAIR_KEYS = ("pair_seed", "sample_cfg", "sample_steps", "samples_per_prompt",
             "pairs_per_prompt", "max_train_prompts")  # fmt: skip


def parse_variant(text: str, base: Any) -> tuple[str, dict[str, Any]]:
    """``NAME:key=value,...`` -> (NAME, {key: value typed as ``base``'s field})."""
    name, _, body = text.partition(":")
    types = {f.name: type(getattr(base, f.name)) for f in fields(base)}
    over: dict[str, Any] = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"variant {name!r}: {key!r} is not a [preference] setting")
        over[key] = types[key](float(value)) if types[key] in (int, float) else value
    return name, over


def run_variant(demo: Path, work: Path, name: str, settings: Any, reuse_pairs: bool) -> dict:
    """Train one STPO variant from the demo's SFT model; returns its model record."""
    from krea2.curate.shapes import concept_scene, eval_prompt
    from krea2.pipeline.chain import load_model
    from krea2.pipeline.config import load_demo_config
    from krea2.pipeline.evaluation import demo_concepts
    from krea2.rl.preference import preference_stage, shapes_preference_reward

    cfg = load_demo_config(False, None, [])
    split, held = demo_concepts(cfg)
    sft = json.loads((demo / "stages" / "sft-merge.json").read_text())["result"]["model"]
    job, index = load_model(sft)
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    source = demo / "preference"
    if not (out / "artifact.npz").exists():
        shutil.copy(source / "artifact.npz", out / "artifact.npz")
    if reuse_pairs and not (out / "pairs.json").exists():
        shutil.copy(source / "pairs.json", out / "pairs.json")
        for folder in ("pair-images", "pair-shards"):
            shutil.copytree(source / folder, out / folder)
    result = preference_stage(
        job, index, out, [eval_prompt(c) for c in split.train],
        [eval_prompt(c) for c in held], shapes_preference_reward(out / "artifact.npz"),
        "stpo", settings, eval_targets=[concept_scene(c) for c in held],
    )  # fmt: skip
    return result["model"]


def measure(demo: Path, work: Path, models: dict[str, dict], seeds: list[int]) -> dict:
    """ShapesEval (CFG 3 and none) of the SFT model and each variant, with paired deltas
    and the HF energy ratio against the SFT model."""
    from krea2.curate.shapes import concept_scene, eval_prompt, shapes_eval
    from krea2.infra.atomic import cached_array
    from krea2.pipeline.chain import load_model
    from krea2.pipeline.config import load_demo_config
    from krea2.pipeline.evaluation import demo_concepts, paired_delta
    from krea2.rl.preference.measures import high_frequency_energy
    from krea2.trainer import sample_stage

    cfg = load_demo_config(False, None, [])
    _, held = demo_concepts(cfg)
    prompts, targets = [eval_prompt(c) for c in held], [concept_scene(c) for c in held]
    sft = json.loads((demo / "stages" / "sft-merge.json").read_text())["result"]["model"]
    out: dict[str, Any] = {}
    for key, scale in (("cfg", 3.0), ("no_cfg", 0.0)):

        def images(name: str, record: dict, scale: float = scale, key: str = key) -> Any:
            return cached_array(work / name / f"eval-{key}.npy", lambda: sample_stage(
                *load_model(record), prompts, seeds, cfg.eval.steps, scale))  # fmt: skip

        base = images("sft", sft)
        b = shapes_eval(base, targets)
        hf_base = high_frequency_energy(base.reshape(-1, *base.shape[2:]))
        out.setdefault("sft", {})[key] = {"shapes_eval": b.score}
        for name, record in models.items():
            tuned = images(name, record)
            t = shapes_eval(tuned, targets)
            hf = high_frequency_energy(tuned.reshape(-1, *tuned.shape[2:]))
            out.setdefault(name, {})[key] = {
                "shapes_eval": t.score,
                "delta": paired_delta(t.per_image, b.per_image),
                "hf_ratio": hf / max(hf_base, 1e-12),
            }
    return out


def markdown(res: dict) -> str:
    rows = []
    for name, over in res["variants"].items():
        m = res["measures"][name]
        c, n = m["cfg"], m["no_cfg"]
        rows.append(
            [
                name,
                ", ".join(f"{k} {v}" for k, v in over.items()) or "the demo's",
                f"{c['shapes_eval']:.3f}",
                f"{c['delta']['delta']:+.3f} ± {c['delta']['se']:.3f}",
                f"{n['shapes_eval']:.3f}",
                f"{n['delta']['delta']:+.3f} ± {n['delta']['se']:.3f}",
                f"{c['hf_ratio']:.2f}",
            ]
        )
    sft = res["measures"]["sft"]
    return (
        "## Why PO lowered the stronger model (`benchmarks/po_ablation.py`)\n\n"
        f"STPO variants from the chain's SFT model (ShapesEval {sft['cfg']['shapes_eval']:.3f} "
        f"with CFG 3, {sft['no_cfg']['shapes_eval']:.3f} without), {res['prompts']} held-out "
        f"prompts × {len(res['seeds'])} seeds; Δ: paired difference to the SFT model ± its "
        "standard error over the prompts; HF: the high-frequency energy of the CFG-3 samples "
        "against the SFT model's.\n\n"
        + table(
            ["variant", "settings changed", "ShapesEval, CFG 3", "Δ", "no CFG", "Δ", "HF ×"], rows
        )
        + f"\n\n{res['seconds']:.0f} s."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", type=Path, required=True, help="a finished full demo's --out")
    ap.add_argument("--work", type=Path, help="default: DEMO/po-ablation")
    ap.add_argument("--variant", action="append", help=f"NAME:key=value,... (default {VARIANTS})")
    ap.add_argument("--seeds", type=int, default=12, help="eval seeds 100, 101, ...")
    args = ap.parse_args()
    from krea2.pipeline.config import load_demo_config
    from krea2.pipeline.evaluation import demo_concepts

    start = time.perf_counter()
    base = load_demo_config(False, None, []).preference
    work = (args.work or args.demo / "po-ablation").resolve()
    seeds = list(range(100, 100 + args.seeds))
    variants, models = {}, {}
    for text in args.variant or VARIANTS:
        name, over = parse_variant(text, base)
        settings = replace(base, **over)
        reuse = all(getattr(settings, k) == getattr(base, k) for k in PAIR_KEYS)
        variants[name] = over
        models[name] = run_variant(args.demo.resolve(), work, name, settings, reuse)
        print(f"{name}: trained ({time.perf_counter() - start:.0f} s)", flush=True)
    res = {
        "demo_preference": asdict(base), "variants": variants, "seeds": seeds,
        "prompts": len(demo_concepts(load_demo_config(False, None, []))[1]),
        "measures": measure(args.demo.resolve(), work, models, seeds),
        "seconds": time.perf_counter() - start,
    }  # fmt: skip
    print(markdown(res))
    write_results("po-ablation", res, markdown(res))
    print("wrote benchmarks/results/po-ablation.json and its docs/benchmarks.md section")


if __name__ == "__main__":
    main()
