"""Our LoRA step against diffusers' ``train_dreambooth_lora_krea2.py`` at the same tiny
config, batch and resolution on CPU: step time and the process's peak memory.

The diffusers example is not in the diffusers wheel and is never committed here. Get it
from a diffusers checkout (the version this was measured with: diffusers main at
58eb52c080, run against the project's diffusers 0.42.1) and put torchvision, which it
imports, in a throwaway folder:

    git -C DIFFUSERS_CHECKOUT show HEAD:examples/dreambooth/train_dreambooth_lora_krea2.py \\
        > /tmp/dfx/train_dreambooth_lora_krea2.py
    uv pip install --python .venv/bin/python --target /tmp/dfx/extra --no-deps torchvision==0.28.0
    uv run --no-sync python -m benchmarks.finetune \\
        --script /tmp/dfx/train_dreambooth_lora_krea2.py --extra /tmp/dfx/extra   # ~10 min

Both train LoRA rank 4 on the attention projections (q, k, v, out, gate: the same Linears)
of the tiny release-shaped model (``krea2.dit.testing.write_tiny_model_folder``: DiT of
width 32, Qwen3-VL text encoder, Qwen-Image VAE), batch 2 at 128 px, fp32, AdamW (betas
0.9/0.999, weight decay 1e-4, clip 1.0, lr 1e-4), one thread, latents cached
(``--cache_latents`` / ``data.cache_latents``) and the one caption encoded once (diffusers
encodes the instance prompt up front; ours caches text by caption). Each run goes through
a runner that timestamps every optimizer step (a global post-step hook) and reads the
process's own peak RSS (VmHWM); step time is the median step-to-step interval after 2 warm-up steps,
over alternating runs of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import table, write_results

RUNNER = """
import json, resource, runpy, sys, time
from torch.optim.optimizer import register_optimizer_step_post_hook
steps = []
register_optimizer_step_post_hook(lambda opt, a, k: steps.append((id(opt), time.perf_counter())))
out, kind, target, *rest = sys.argv[1:]
sys.argv = [target, *rest]
try:
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
except SystemExit as e:
    if e.code not in (0, None):
        raise
first = steps[0][0] if steps else None
times = [t for o, t in steps if o == first]
# VmHWM: this process's own peak (ru_maxrss would carry the parent's peak over fork/exec)
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")]
rss = int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
json.dump({"times": times, "maxrss_kb": rss}, open(out, "w"))
"""
PROMPT = "a blue circle in the middle, on a plain black background"
RANK, BATCH, SIDE, LR = 4, 2, 128, 1e-4


def make_inputs(root: Path, n: int) -> tuple[Path, Path, Path]:
    """The tiny model folder, a folder of ``n`` 128 px images (diffusers' instance data; one
    instance prompt) and the shards of the same images captioned with that prompt."""
    from PIL import Image

    from krea2.curate import prepare_folder, shapes
    from krea2.dit.testing import write_tiny_model_folder

    model = write_tiny_model_folder(root / "model")
    images, captioned = root / "images", root / "captioned"  # diffusers reads every file
    images.mkdir()
    captioned.mkdir()
    split = shapes.split_concepts(0)
    for i, concept in enumerate(split.train[:n]):
        scene = shapes.concept_scene(concept, "black")
        for d in (images, captioned):
            Image.fromarray(shapes.render(scene, SIDE, SIDE)).save(d / f"img{i}.png")
        (captioned / f"img{i}.txt").write_text(PROMPT)
    prepare_folder(captioned, root / "shards", side=SIDE, min_side=64, batch_size=BATCH)
    return model, images, root / "shards"


def our_job(root: Path, model: Path, shards: Path, steps: int, r: int) -> Path:
    path = root / f"ours-{r}.toml"
    path.write_text(f"""
run_dir = "{root / f"ours-run-{r}"}"
seed = 0
[model]
name = "tiny"
autoencoder = "qwen-image:{model / "vae"}"
[model.overrides]
text_taps = 12
latent_channels = 16
[text]
encoder = "qwen3-vl:{model / "text_encoder"}"
max_tokens = 512
cache_size = 64
[optimizer]
lr = {LR}
betas = [0.9, 0.999]
weight_decay = 1e-4
grad_clip = 1.0
[parallel]
threads = 1
[data]
workers = 0
cache_latents = 64
[checkpoint]
every = 0
keep_last = 1
[observe]
log_every = 100
tracker = "none"
[[stages]]
name = "lora"
data = ["{shards}/shard-*.parquet"]
resolution = {SIDE}
steps = {steps}
batch_size = {BATCH}
caption_dropout = 0.0
init_from = "{model}"
[stages.schedule]
warmup_steps = 0
decay_ratio = 0.0
[stages.lora]
rank = {RANK}
alpha = {RANK}
targets = 'blocks\\.\\d+\\.attn\\.(wq|wk|wv|wo|gate)'
""")
    return path


def run(runner: Path, out: Path, kind: str, target: str, args: list[str], env: dict) -> dict:
    t0 = time.perf_counter()
    cmd = [sys.executable, str(runner), str(out), kind, target, *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{target} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rec = json.loads(out.read_text())
    gaps = [b - a for a, b in zip(rec["times"], rec["times"][1:], strict=False)][2:]
    return {
        "step_s": statistics.median(gaps),
        "steps": len(rec["times"]),
        "peak_rss_mb": rec["maxrss_kb"] / 1024,
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", type=Path, required=True, help="train_dreambooth_lora_krea2.py")
    p.add_argument("--extra", type=Path, help="folder holding torchvision for the script")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    args = p.parse_args()
    if not args.script.is_file():
        raise SystemExit(f"{args.script} not found; see this script's docstring")
    root = Path(tempfile.mkdtemp(prefix="finetune-"))
    runner = root / "runner.py"
    runner.write_text(RUNNER)
    model, images, shards = make_inputs(root, 8)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if args.extra:
        env["PYTHONPATH"] = os.pathsep.join([str(args.extra), env.get("PYTHONPATH", "")])
    diff_args = [
        f"--pretrained_model_name_or_path={model}", f"--instance_data_dir={images}",
        f"--instance_prompt={PROMPT}", f"--resolution={SIDE}", f"--train_batch_size={BATCH}",
        f"--rank={RANK}", f"--lora_alpha={RANK}", "--lora_layers=to_q,to_k,to_v,to_out.0,to_gate",
        "--optimizer=adamW", f"--learning_rate={LR}", "--lr_scheduler=constant",
        "--lr_warmup_steps=0", f"--max_train_steps={args.steps}", "--seed=0", "--cache_latents",
        "--mixed_precision=no", "--dataloader_num_workers=0", "--max_sequence_length=512",
    ]  # fmt: skip
    results: dict[str, list[dict]] = {"ours": [], "diffusers": []}
    for r in range(args.rounds):
        cfg = our_job(root, model, shards, args.steps, r)
        results["ours"].append(run(runner, root / f"ours-{r}.json", "module", "krea2.trainer",
                                   ["--config", str(cfg)], env))  # fmt: skip
        out_dir = root / f"diffusers-out-{r}"
        results["diffusers"].append(run(runner, root / f"diff-{r}.json", "path", str(args.script),
                                        [*diff_args, f"--output_dir={out_dir}"], env))  # fmt: skip
        print(r, {k: v[-1] for k, v in results.items()}, flush=True)
    med = {
        k: {m: statistics.median(x[m] for x in v) for m in ("step_s", "peak_rss_mb")}
        for k, v in results.items()
    }
    speed = med["diffusers"]["step_s"] / med["ours"]["step_s"]
    memory = med["ours"]["peak_rss_mb"] / med["diffusers"]["peak_rss_mb"]
    rows = [
        [name, f"{m['step_s'] * 1000:.0f}", f"{m['peak_rss_mb']:.0f}",
         ", ".join(f"{x['step_s'] * 1000:.0f}" for x in results[name])]
        for name, m in med.items()
    ]  # fmt: skip
    md = "\n".join([
        "## LoRA step: ours vs diffusers' train_dreambooth_lora_krea2.py "
        "(`benchmarks/finetune.py`)",
        "",
        f"The tiny release-shaped model (DiT width 32; Qwen3-VL and Qwen-Image VAE, random), "
        f"LoRA rank {RANK} on the attention projections (q, k, v, out, gate), batch {BATCH} at "
        f"{SIDE} px, fp32, AdamW lr {LR:g}, one CPU thread each, latents and the caption "
        f"cached. Step time: median step-to-step interval after 2 warm-up steps of "
        f"{args.steps}, per run, median over {args.rounds} alternating runs; peak memory: the "
        "process's peak RSS (whole process, imports and model loading included). diffusers' "
        "script from diffusers main 58eb52c080 on diffusers 0.42.1.",
        "",
        table(["trainer", "step ms (median)", "peak RSS MB", "step ms per run"], rows),
        "",
        f"Ours: **{speed:.2f}x** the diffusers step rate (target >= 1.2x), peak memory "
        f"**{memory:.2f}x** diffusers' (target <= 1.0x).",
    ])  # fmt: skip
    write_results("finetune", {"args": {k: str(v) for k, v in vars(args).items()},
                               "runs": results, "median": med, "speedup": speed,
                               "memory_ratio": memory}, md)  # fmt: skip
    print(md)


if __name__ == "__main__":
    main()
