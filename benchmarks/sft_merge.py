"""Domain SFT and merging on ShapesWorld (report §4.3): one pretrained toy DiT, one LoRA
SFT per domain, and their merges (uniform, weighted, TIES; task arithmetic as a reference),
scored by a background-style classifier over samples and by ShapesEval.

    uv run --no-sync python benchmarks/sft_merge.py     # 17-32 min on the loaded 2-core VM
    uv run --no-sync python benchmarks/sft_merge.py --pretrain 200 --sft 60   # a smoke run

The base is pretrained here on one-object scenes of the world's training concepts on its
black / dark gray backgrounds (rendered from krea2.curate.shapes, exported by
krea2.curate.export_shards). The SFT and merge stage is the demo's
(krea2.pipeline.sft_merge): each domain owns its part of prompt space (A: circles on navy,
B: squares on dark green), each domain set replays the base's scenes, and each style is
measured on its own domain's prompts.

Earlier runs of this script restyled the same prompts in both domains (every training
concept on navy for A, on dark green for B): each SFT took its style (0.92-1.00) but no
merge kept both (dark green 0.00-0.04 after uniform, weighted, TIES and task arithmetic),
because the two task vectors then change one property of the same prompts and a merge can
only average them (see the sft_merge section of docs/benchmarks.md).
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

SIDE = 32
THREADS = 2  # --threads


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
threads = {THREADS}
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrain", type=int, default=200)
    p.add_argument("--sft", type=int, default=150)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-3, help="SFT learning rate")
    p.add_argument("--steps", type=int, default=12, help="sampling steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args()
    global THREADS
    THREADS = args.threads
    torch.set_num_threads(args.threads)
    from krea2.pipeline.sft_merge import HEADERS, SftMergeSettings, rows, run_sft_merge
    from krea2.trainer.cli import run_job
    from krea2.trainer.config import load_job

    t0 = time.perf_counter()
    split = shapes.split_concepts(0)
    root = Path(tempfile.mkdtemp(prefix="sft-merge-"))
    base_data = write_shards(root / "base", split.train, ["black", "dark gray"], 2, 0)
    base_job = job_toml(root / "base.toml", root / "base-run", base_data, args.pretrain, 1e-3)
    run_job(base_job, [], resume=False)
    settings = SftMergeSettings(steps=args.sft, lr=args.lr, rank=args.rank,
                                sample_steps=args.steps)  # fmt: skip
    result = run_sft_merge(
        load_job(base_job), 0, root / "sft-merge", list(split.train), list(split.held_out),
        settings,
    )  # fmt: skip
    for name, m in result["models"].items():
        print(name, m, flush=True)
    elapsed = time.perf_counter() - t0
    md = "\n".join([
        "## Domain SFT and merging on ShapesWorld (`benchmarks/sft_merge.py`)",
        "",
        f"Toy DiT pretrained {args.pretrain} steps on black/dark gray scenes of every training "
        f"concept. Domain A owns the circle prompts (its set: circles on navy), domain B the "
        f"square prompts (squares on dark green); each set also replays the base's scenes of "
        f"every concept. LoRA r{args.rank}, {args.sft} SFT steps per domain at lr {args.lr:g}. "
        f"Style columns: share of samples whose background the classifier (median pixel -> "
        f"nearest named colour) calls the colour the prompt asks for, on "
        f"{settings.style_prompts} of that domain's prompts x {len(settings.seeds)} seeds; "
        f"ShapesEval on the {len(split.held_out)} held-out concepts on black (all shapes, "
        f"{len(settings.seeds)} seeds). {elapsed / 60:.1f} min.",
        "",
        table(HEADERS, rows(result)),
    ])  # fmt: skip
    write_results("sft_merge", {"args": vars(args), "result": result, "elapsed_s": elapsed}, md)
    print(md)


if __name__ == "__main__":
    main()
