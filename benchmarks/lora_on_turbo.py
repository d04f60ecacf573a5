"""A LoRA trained on raw, applied to the Turbo student (issue #43 item 4): its style and
ShapesEval at the student's steps against raw at 20 steps.

From a finished full demo (``--demo DIR``): the demo's domain-A SFT (circles drawn on
maroon, :mod:`krea2.pipeline.sft_merge`, the demo's settings) is trained as a LoRA on the
chain's final model ``raw``, exported in the ComfyUI layout (`krea2 train export --format
comfyui`) and read back with :func:`krea2.dit.load_lora` (what `krea2 dit sample|serve
--lora` use). Raw at ``[eval]``'s steps without CFG (how the chain measures it: RL trained
it without CFG) and the Turbo student at its own steps without CFG are each sampled with
the adapter off and on (``--scale``): the share of domain A's content prompts drawn in its
style (maroon backgrounds, 12 prompts) and ShapesEval on the held-out prompts (paired with
the same model without the adapter, ± s.e. over the prompts), ``--seeds`` seeds each.

    uv run --frozen python -m benchmarks.lora_on_turbo --demo DIR [--seeds 3]

Writes benchmarks/results/lora_on_turbo.json and the ``lora_on_turbo`` section of
docs/benchmarks.md; the LoRA run stays under DIR/lora-on-turbo (a rerun reuses it).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.report import table, write_results


def train_lora(raw, work: Path, train, cfg) -> Path:  # type: ignore[no-untyped-def]
    """Domain A's SFT as a LoRA on ``raw`` (job, index), exported (ComfyUI layout)."""
    from krea2.infra import CheckpointManager
    from krea2.pipeline import sft_merge as sm
    from krea2.trainer import Trainer, export_adapter, link_finished, stage_root

    out = work / "sft-A-on-raw.safetensors"
    if out.is_file():
        return out
    job, index = raw
    s = sm.demo_settings(cfg)
    data = sm.write_domain_shards(work / "data-A", train, "A", job.stages[index].resolution,
                                  s.copies, 0, s.batch_size, s.own_factor)  # fmt: skip
    sft = sm.sft_job(job, index, "A", data, s, work / "run-A")
    # raw's stage is an RL objective; the SFT on top of it is plain flow matching
    last = replace(sft.stages[-1], objective="flow", settings={}, spike_guard=None, ema_decay=0.0)
    sft = replace(sft, stages=[*sft.stages[:-1], last])
    link_finished(job, index, sft.run_dir)
    Trainer(sft, resume=True).run()
    root = CheckpointManager(stage_root(sft, sft.stages[-1]))
    return export_adapter(sft, len(sft.stages) - 1, root.path_of(root.latest_step()), out,
                          "comfyui")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", type=Path, required=True, help="a finished full demo's --out")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per prompt")
    ap.add_argument("--scale", type=float, default=1.0, help="the adapter's scale when on")
    args = ap.parse_args()
    from krea2.curate.shapes import concept_scene, eval_prompt, shapes_eval
    from krea2.dit import applied, load_lora
    from krea2.pipeline import sft_merge as sm
    from krea2.pipeline.chain import load_model
    from krea2.pipeline.config import load_demo_config
    from krea2.pipeline.evaluation import demo_concepts, paired_delta
    from krea2.trainer import load_stage_module, sample_module

    demo, cfg = args.demo.resolve(), load_demo_config(False, None, [])
    split, held = demo_concepts(cfg)
    prompts, targets = [eval_prompt(c) for c in held], [concept_scene(c) for c in held]
    stage = lambda name: json.loads((demo / "stages" / f"{name}.json").read_text())["result"]  # noqa: E731
    raw, turbo = load_model(stage("rl")["model"]), load_model(stage("turbo")["model"])
    path = train_lora(raw, demo / "lora-on-turbo", list(split.train), cfg)
    adapter = load_lora(path)
    style_prompts = sm.style_prompts(list(split.train), "A", 12)
    seeds = list(cfg.eval.seeds[: args.seeds])
    k = cfg.turbo.tdm.student_steps
    rows = {}
    for who, (job, index), steps in (("raw", raw, cfg.eval.steps), ("turbo", turbo, k)):
        module = load_stage_module(job, index)
        p = next(module.parameters())
        moved, scores = adapter.to(p.device, p.dtype), {}
        for scale in (0.0, args.scale):
            with applied(module.dit, [(moved, scale)]):
                styled = sample_module(job, index, module, style_prompts, seeds, steps, 0.0)
                images = sample_module(job, index, module, prompts, seeds, steps, 0.0)
            seen = [sm.background_style(im) for per in styled for im in per]
            scored = shapes_eval(images, targets)
            scores[scale] = scored.per_image
            rows[f"{who} LoRA x{scale:g}"] = {
                "model": who, "steps": steps, "scale": scale,
                "style_A": float(np.mean([x == sm.DOMAINS["A"][1] for x in seen])),
                "shapes_eval": scored.score,
                "delta": paired_delta(scored.per_image, scores[0.0]),
            }  # fmt: skip
    res = {"adapter": str(path), "rank": adapter.rank, "seeds": seeds, "prompts": len(prompts),
           "style_prompts": len(style_prompts), "rows": rows}  # fmt: skip
    write_results("lora_on_turbo", res, markdown(res))
    print(json.dumps(rows, indent=1))


def markdown(res: dict) -> str:
    rows = []
    for name, r in res["rows"].items():
        d = r["delta"]
        delta = "" if r["scale"] == 0 else f" ({d['delta']:+.3f} ± {d['se']:.3f})"
        rows.append([name, r["steps"], f"{r['style_A']:.2f}", f"{r['shapes_eval']:.3f}{delta}"])
    return (
        "## A LoRA trained on raw, on Turbo (`lora_on_turbo`)\n\n"
        f"Domain A's SFT (circles on maroon) trained as a rank-{res['rank']} LoRA on the "
        "chain's raw model, read back from its ComfyUI file and applied by hooks "
        "(`krea2 dit sample --lora`), on raw at 20 steps and on the Turbo student at its own "
        "steps, both without CFG. Style A: share of domain A's "
        f"{res['style_prompts']} content prompts drawn on maroon; ShapesEval on "
        f"{res['prompts']} held-out prompts, paired with the same model without the adapter "
        f"(± s.e. over the prompts); {len(res['seeds'])} seeds each.\n\n"
    ) + table(["model", "steps", "style A", "ShapesEval"], rows)


if __name__ == "__main__":
    main()
