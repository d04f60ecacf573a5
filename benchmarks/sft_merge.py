"""Domain SFT and merging on ShapesWorld (report §4.3): two background styles, one LoRA SFT
each from one pretrained toy DiT, and their merges (uniform, weighted, TIES), scored by a
background-style classifier over samples and by ShapesEval.

    uv run --no-sync python benchmarks/sft_merge.py                # ~10 min on 2 cores
    uv run --no-sync python benchmarks/sft_merge.py --pretrain 200 --sft 60   # a smoke run
    uv run --no-sync python benchmarks/sft_merge.py --mix-base  # domain sets keep the base's

Data (rendered here from krea2.curate.shapes, exported by krea2.curate.export_shards):
one-object scenes of the world's training concepts on its black / dark gray backgrounds
(pretraining), and the same scenes on navy (domain A) or dark green (domain B). Each
domain SFT is a LoRA stage of krea2.trainer on the pretrained weights (the text table stays
the pretrained one, so every model reads prompts alike); an adapter merged into the base is
that domain's fine-tuned model, and the merges combine the two. The style classifier is the
nearest background colour to the image's median pixel (one object covers under a ninth of
the image); ground truth is the colour the prompt asks for. ShapesEval: the held-out
concepts on black, prompts never seen in training.

With domain sets of the new background only, each SFT learns its style unconditionally
(every prompt comes out navy), and merged task vectors then fight over one property.
``--mix-base`` also puts the base's backgrounds in each domain's set, so each SFT learns
the style only where the prompt names it (results in the ``sft_merge_mixed`` section).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/queue.py

import numpy as np  # noqa: E402
import torch  # noqa: E402

_spec = importlib.util.spec_from_file_location("report", HERE / "report.py")
_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_report)
table, write_results = _report.table, _report.write_results

from krea2.curate import Sample, export_shards, shapes  # noqa: E402
from krea2.curate.shapes.spec import BACKGROUND_COLORS  # noqa: E402

SIDE = 32
DOMAINS = {"A": "navy", "B": "dark green"}
STYLES = ("black", "dark gray", "navy", "dark green")


def write_shards(root: Path, concepts, backgrounds: list[str], copies: int, seed: int) -> Path:
    """Scenes of ``concepts`` on each of ``backgrounds`` (``copies`` jittered renders each)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    samples = []
    for i, concept in enumerate(concepts):
        for bg in backgrounds:
            for c in range(copies):
                jitter = tuple(float(x) for x in rng.uniform(-0.3, 0.3, 2))
                scene = shapes.concept_scene(concept, bg, "large", jitter)
                buf = io.BytesIO()
                Image.fromarray(shapes.render(scene, SIDE, SIDE)).save(buf, format="PNG")
                caps = shapes.captions(scene)
                samples.append(Sample(f"{bg}-{i}-{c}", buf.getvalue(), caps))
    export_shards(samples, root, "p32", SIDE, seed=seed, batch_size=32)
    return root


def job_toml(path: Path, run: Path, data: Path, steps: int, lr: float, init_from: str = "",
             rank: int = 0) -> Path:  # fmt: skip
    lora = f"\n[stages.lora]\nrank = {rank}\nalpha = {rank}\n" if rank else ""
    init = f'init_from = "{init_from}"\n' if init_from else ""
    path.write_text(f"""
run_dir = "{run}"
seed = 0
[model]
name = "toy"
[text]
max_tokens = 24
[optimizer]
lr = {lr}
[parallel]
threads = 2
[data]
workers = 0
[checkpoint]
every = 0
keep_last = 1
[observe]
log_every = 50
tracker = "none"
[[stages]]
name = "p32"
data = ["{data}"]
resolution = {SIDE}
steps = {steps}
batch_size = 32
caption_dropout = 0.1
{init}[stages.schedule]
warmup_steps = 20
decay_ratio = 0.2
{lora}""")
    return path


def background_style(image: np.ndarray) -> str:
    """The named background colour nearest the image's median pixel."""
    median = np.median(image.reshape(-1, 3), axis=0)
    dist = {s: float(np.abs(median - np.array(BACKGROUND_COLORS[s])).sum()) for s in STYLES}
    return min(dist, key=dist.get)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrain", type=int, default=600)
    p.add_argument("--sft", type=int, default=150)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--steps", type=int, default=16, help="sampling steps")
    p.add_argument("--mix-base", action="store_true", help="domain sets keep base backgrounds")
    args = p.parse_args()
    torch.set_num_threads(2)
    from krea2.trainer.adapters import export_adapter
    from krea2.trainer.cli import run_job
    from krea2.trainer.config import load_job
    from krea2.trainer.inference import load_stage_module, sample_module
    from krea2.trainer.merge import average, ties_merge

    t0 = time.perf_counter()
    split = shapes.split_concepts(0)
    root = Path(tempfile.mkdtemp(prefix="sft-merge-"))
    base_data = write_shards(root / "base", split.train, ["black", "dark gray"], 2, 0)
    extra = ["black", "dark gray"] if args.mix_base else []
    domain_data = {
        d: write_shards(root / d, split.train, [bg, *extra], 2, 1) for d, bg in DOMAINS.items()
    }
    base_job = job_toml(root / "base.toml", root / "base-run", base_data, args.pretrain, 1e-3)
    run_job(base_job, [], resume=False)
    base_ckpt = sorted((root / "base-run" / "checkpoints" / "p32").glob("step-*"))[-1]
    job = load_job(base_job)
    weights = {"base": average([base_ckpt])}
    base_file = root / "base.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in weights["base"].items()}, str(base_file))
    merged_files = {}
    for d in DOMAINS:
        cfg = job_toml(root / f"{d}.toml", root / f"{d}-run", domain_data[d], args.sft, 3e-3,
                       str(base_ckpt.parent), args.rank)  # fmt: skip
        run_job(cfg, [], resume=False)
        sft = load_job(cfg)
        last = sorted((root / f"{d}-run" / "checkpoints" / "p32").glob("step-*"))[-1]
        out = root / f"sft-{d}.safetensors"
        export_adapter(sft, 0, last, out, "krea-merged", base=base_file)
        merged_files[d] = out
        from krea2.dit.weights import read_checkpoint

        weights[f"SFT {d} ({DOMAINS[d]})"] = read_checkpoint(out)[0]
    both = [merged_files["A"], merged_files["B"]]
    weights["uniform merge"] = average(both)
    weights["weighted merge 0.6/0.4"] = average(both, [0.6, 0.4])
    weights["TIES merge (density 0.5)"] = ties_merge(base_file, both, density=0.5)
    # Averages halve each domain's task vector; task arithmetic adds both in full
    # (Ilharco et al. 2023): base + (A - base) + (B - base).
    a, b, base_w = weights["SFT A (navy)"], weights["SFT B (dark green)"], weights["base"]
    weights["task arithmetic A + B - base"] = {k: a[k] + b[k] - base_w[k] for k in base_w}

    module = load_stage_module(job, 0)  # the pretrained text table for every model
    style_prompts = {}
    for d, bg in DOMAINS.items():
        picks = split.train[:: max(1, len(split.train) // 12)][:12]
        style_prompts[d] = [shapes.captions(shapes.concept_scene(c, bg))["long"] for c in picks]
    eval_scenes = [shapes.concept_scene(c, "black") for c in split.held_out]
    eval_prompts = [shapes.captions(s)["long"] for s in eval_scenes]
    seeds = [0, 1]
    rows, results = [], {}
    for name, state in weights.items():
        module.dit.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
        share = {}
        for d, bg in DOMAINS.items():
            imgs = sample_module(job, 0, module, style_prompts[d], seeds, args.steps, 2.0)
            styles = [background_style(im) for row in imgs for im in row]
            share[d] = sum(s == bg for s in styles) / len(styles)
        imgs = sample_module(job, 0, module, eval_prompts, seeds, args.steps, 2.0)
        score = float(shapes.shapes_eval(imgs, eval_scenes).score)
        results[name] = {"style_A": share["A"], "style_B": share["B"], "shapes_eval": score}
        rows.append([name, f"{share['A']:.2f}", f"{share['B']:.2f}", f"{score:.3f}"])
        print(rows[-1], flush=True)
    elapsed = time.perf_counter() - t0
    area = "sft_merge_mixed" if args.mix_base else "sft_merge"
    sets = (
        "navy or dark green scenes plus the base's black/dark gray ones"
        if args.mix_base
        else ("navy or dark green scenes only")
    )
    md = "\n".join([
        "## Domain SFT and merging on ShapesWorld "
        f"(`benchmarks/sft_merge.py{' --mix-base' * args.mix_base}`)",
        "",
        f"Domain sets: {sets}.",
        "",
        f"Toy DiT pretrained {args.pretrain} steps on black/dark gray scenes; LoRA r{args.rank} "
        f"SFT {args.sft} steps per domain (A: navy, B: dark green backgrounds); the style "
        "columns are the share of samples whose background the classifier calls the colour "
        f"the prompt asks for (12 prompts x 2 seeds per domain); ShapesEval on the "
        f"{len(eval_prompts)} held-out concepts (2 seeds). {elapsed / 60:.1f} min.",
        "",
        table(["model", "style A (navy)", "style B (dark green)", "ShapesEval"], rows),
    ])  # fmt: skip
    write_results(area, {"args": vars(args), "results": results, "elapsed_s": elapsed}, md)
    print(md)


if __name__ == "__main__":
    main()
