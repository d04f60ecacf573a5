"""Look inside the runs of benchmarks/rl_grpo_proof.py: ShapesEval without CFG (the proof's
seeds and Euler steps) of one run's checkpoint at any kept step, or of the exact mean of
several runs' LoRA deltas, on the held-out prompts or on the training concepts broken down
by the pool's verdict (kept, always solved, never solved).

    uv run --frozen python -m benchmarks.rl_grpo_diagnose --demo DIR --work W RUN [RUN ...]
        [--step N] [--prompts held-out|train] [--pretrained]

``RUN`` names a finished variant under ``W`` (its ``W/RUN.json``); several runs are averaged
(per adapted Linear: mean of scale x B @ A, merged into the base, so the average is exact
whatever the ranks). ``--step N``: each run's checkpoint of step N (a kept one: the newest
two are kept) instead of its newest. ``--pretrained``: the pretrained model instead of any
run. Prints one JSON line; writes nothing.

    # checkpoints 20 iterations apart, and the three seeds' mean delta
    ... --work W hard4 --step 219
    ... --work W hard4 hard4-seed1 hard4-seed2
    # what the pool's verdicts become after RL
    ... --work W hard4-seed1 --prompts train
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def averaged_module(pretrain_job, stage: int, work: Path, runs: list[str], step: int | None):
    """(job, module) of ``runs[0]`` (RL runs from ``pretrain_job.stages[stage]``) with
    every run's adapter delta averaged into its base weights (the adapters zeroed; one
    run: its own weights, merged); full fine-tunes: their weights averaged."""
    import torch
    from peft.tuners.lora import LoraLayer

    from krea2.rl.online import settings_with
    from krea2.rl.online.stage import stage_job
    from krea2.trainer import load_stage_module
    from krea2.trainer.lora import ADAPTER

    loaded = []
    for run in runs:
        s = settings_with(json.loads((work / f"{run}.json").read_text())["settings"], {})
        job = stage_job(pretrain_job, stage, work / run, work / "prompt-shards", s)
        loaded.append((job, load_stage_module(job, len(job.stages) - 1, step=step)))
    job, module = loaded[0]
    layers = [[m for m in mod.modules() if isinstance(m, LoraLayer)] for _, mod in loaded]
    if not layers[0]:  # full fine-tuning: average the weights themselves
        with torch.no_grad():
            for ps in zip(*(mod.parameters() for _, mod in loaded), strict=True):
                ps[0].copy_(torch.stack([p.float() for p in ps]).mean(0).to(ps[0].dtype))
        return job, module
    with torch.no_grad():
        for group in zip(*layers, strict=True):
            delta = sum(
                layer.scaling[ADAPTER]
                * layer.lora_B[ADAPTER].weight.float()
                @ layer.lora_A[ADAPTER].weight.float()
                for layer in group
            ) / len(group)
            base = group[0].base_layer.weight
            base.copy_((base.float() + delta).to(base.dtype))
            group[0].lora_B[ADAPTER].weight.zero_()
    return job, module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--prompts", choices=("held-out", "train"), default="held-out")
    ap.add_argument("--pretrained", action="store_true")
    args = ap.parse_args()
    if bool(args.runs) == args.pretrained:
        raise SystemExit("name the runs to measure, or --pretrained (not both)")
    unfinished = [r for r in args.runs if not (args.work / f"{r}.json").is_file()]
    if unfinished:
        raise SystemExit(f"no finished run {unfinished} under {args.work} (its NAME.json)")
    from krea2.curate.shapes import concept_scene, eval_prompt, shapes_eval
    from krea2.infra.errors import UserError
    from krea2.pipeline import evaluation
    from krea2.pipeline.config import demo_training_job, load_demo_config
    from krea2.rl.online import RlStageSettings, settings_with
    from krea2.rl.online.pool import read_records
    from krea2.trainer import load_stage_module, sample_module

    cfg = load_demo_config(False)
    pretrain_job, finished = demo_training_job(cfg, args.demo)
    if not finished:
        raise SystemExit(f"{args.demo} has no finished pretraining; run krea2 demo --out DIR")
    stage = len(pretrain_job.stages) - 1
    split, held = evaluation.demo_concepts(cfg)
    concepts = list(split.train) if args.prompts == "train" else list(held)
    prompts = [eval_prompt(c) for c in concepts]
    s = RlStageSettings()
    if args.pretrained:
        job, module = pretrain_job, load_stage_module(pretrain_job, stage)
    else:
        s = settings_with(json.loads((args.work / f"{args.runs[0]}.json").read_text())
                          ["settings"], {})  # fmt: skip
        try:
            job, module = averaged_module(pretrain_job, stage, args.work, args.runs, args.step)
        except UserError as exc:  # e.g. a step whose checkpoint was not kept
            raise SystemExit(f"error: {exc}") from None
    images = sample_module(job, len(job.stages) - 1, module, prompts, list(s.eval_seeds),
                           s.eval_steps, 0.0)  # fmt: skip
    score = shapes_eval(images, [concept_scene(c) for c in concepts])
    out = {
        "runs": args.runs or ["pretrained"],
        "step": args.step,
        "prompts": args.prompts,
        "shapes_eval": round(score.score, 3),
        "all_correct": round(score.all_correct, 3),
    }
    if args.prompts == "train":
        verdict = {r.prompt: r.reason for r in read_records(args.work / "pool.json")}
        per = np.asarray([np.mean(v) for v in score.per_image])
        groups: dict[str, list[float]] = {}
        for p, v in zip(prompts, per, strict=True):
            groups.setdefault(verdict.get(p, "not in the pool"), []).append(float(v))
        out["by_verdict"] = {k: [len(v), round(float(np.mean(v)), 3)] for k, v in groups.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
