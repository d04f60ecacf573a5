"""Trainer benchmarks: loop overhead vs the bare step, loader headroom, the 12B projection.

    uv run --no-sync python -m benchmarks.trainer            # overhead, loader, projection
    uv run --no-sync python -m benchmarks.trainer --proof 1800  # + a ShapesWorld run of 1800 steps

The bare step (forward + backward + AdamW of the same module on a fixed batch) and the full
trainer step (shard reading and decoding, caption sampling, per-sample noise, clipping,
guards, JSON-lines and Prometheus metrics, an async checkpoint every K steps) run in the
same process, alternately, so machine load hits both alike.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import table, write_results


def toy_job(
    root: Path, steps: int, batch: int, every: int, workers: int, keep_freed_memory: bool = True
) -> Path:
    job = root / "job.toml"
    job.write_text(f"""
run_dir = "{root / "run"}"
[text]
max_tokens = 24
[parallel]
threads = 2
keep_freed_memory = {str(keep_freed_memory).lower()}
[data]
workers = {workers}
[checkpoint]
every = {every}
keep_last = 2
[observe]
log_every = 1
peak_tflops = 0.2
[[stages]]
name = "bench"
data = ["{root / "shards"}"]
steps = {steps}
batch_size = {batch}
[stages.schedule]
warmup_steps = 5
""")
    return job


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def full_step_seconds(job: Path, skip: int) -> dict[str, float]:
    """Per trainer step after ``skip`` warm-up steps: median and mean wall seconds between
    consecutive metric rows (data waits, logging and saves included) and median CPU
    seconds of the training process (robust to other load on a shared machine)."""
    from krea2.trainer.cli import run_job
    from krea2.trainer.observe import read_metrics

    run_job(job, [], resume=False)
    rows = [r for r in read_metrics(job.parent / "run" / "metrics.jsonl") if r["kind"] == "train"]
    rows = rows[skip:]
    stamps = [r["time"] for r in rows]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "wall_median": median(gaps),
        "wall_mean": (stamps[-1] - stamps[0]) / (len(stamps) - 1),
        "cpu_median": median([r["step_cpu_time"] for r in rows]),
        "cpu_mean": sum(r["step_cpu_time"] for r in rows) / len(rows),
    }


def bare_step_seconds(job: Path, steps: int, skip: int) -> dict[str, float]:
    """Forward + backward + AdamW of the job's module on one fixed batch: wall and CPU
    seconds per step, and minor page faults per step (``faults``)."""
    import resource

    import torch

    from krea2.trainer.build import build_module
    from krea2.trainer.config import load_job
    from krea2.trainer.distributed import init_distributed

    cfg = load_job(job)
    stage = cfg.stages[0]
    module = build_module(cfg, stage, init_distributed(cfg))
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    b = stage.batch_size
    x, t = torch.randn(b, 3, 32, 32), torch.rand(b)
    caps = ["a red circle in the top left"] * b
    wall, cpu, faults = [], [], []
    for i in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        v, _ = module(x, t, caps)
        v.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= skip:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {
        "wall_median": median(wall),
        "wall_mean": sum(wall) / len(wall),
        "cpu_median": median(cpu),
        "cpu_mean": sum(cpu) / len(cpu),
        "faults": median(faults),
    }


def heap_child(mode: str, batch: int, steps: int) -> None:
    """One bare-step measurement with malloc's default behaviour or krea2.infra.heap's
    (process-global, hence a child process per mode); prints its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        job = toy_job(Path(tmp), steps, batch, 0, 0, keep_freed_memory=mode == "keep")
        print(json.dumps(bare_step_seconds(job, steps, 5)))


def heap_comparison(batch: int, steps: int, rounds: int = 3) -> dict:
    """Bare toy steps with malloc's defaults vs ``keep_freed_memory``, in child processes
    run alternately (``rounds`` each), so load on a shared machine hits both alike."""
    import subprocess

    runs: dict[str, list[dict]] = {"system": [], "keep": []}
    for _ in range(rounds):
        for mode in runs:
            cmd = [sys.executable, "-m", "benchmarks.trainer", "--heap-child", mode]
            cmd += ["--batch", str(batch), "--steps", str(steps)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    return {
        mode: {k: median([r[k] for r in rs]) for k in rs[0]} | {"runs": rs}
        for mode, rs in runs.items()
    }


def loader_rate(shards: Path, batch: int, batches: int, workers: int) -> float:
    from krea2.trainer.data import ShardIndex, batch_loader

    index = ShardIndex(sorted(shards.glob("*.parquet")), batch, 0)
    it = iter(batch_loader(index, 0, 1, 0, batches + 2, workers, 4))
    next(it), next(it)  # worker start-up is not throughput
    t0 = time.perf_counter()
    n = sum(1 for _ in it)
    return n / (time.perf_counter() - t0)


def projection_rows() -> tuple[list[list], dict]:
    from krea2.dit.config import get_config
    from krea2.trainer.projection import Layout, project

    cfg = get_config("krea2-12b")
    rows, raw = [], {}
    for dp, tp in ((128, 1), (64, 2), (32, 4)):
        for ac in ("full", "selective"):
            lay = Layout(dp=dp, tp=tp, global_batch=1024, image_tokens=4096, checkpointing=ac)
            p = project(cfg, lay)
            raw[f"dp{dp}_tp{tp}_{ac}"] = p.as_dict()
            rows.append(
                [
                    f"{dp}x{tp}",
                    ac,
                    f"{p.train_flops_per_step / 1e15:.0f}",
                    f"{p.params_gib:.2f}",
                    f"{p.optimizer_gib:.2f}",
                    f"{p.gathered_unit_gib:.2f}",
                    f"{p.activations_gib:.1f}",
                    f"{p.total_gib:.1f}",
                    f"{p.step_seconds_at_mfu:.1f}",
                ]
            )
    return rows, raw


def proof(steps: int, root: Path) -> dict:
    """The ShapesWorld toy proof at the toy config (batch 64), for ``steps`` steps."""
    import tests.test_trainer_on_shapes as sp
    from krea2.curate import shapes
    from krea2.trainer.cli import run_job
    from krea2.trainer.observe import read_metrics

    held = sp.held_out_combos()
    sp.write_shapes_shards(root / "train", sp.scenes(20000, 0, held, False), 32, 64, seed=0)
    eval_scenes = sp.scenes(128, 1, held, True)
    sp.write_shapes_shards(root / "eval", eval_scenes, 32, 64, seed=1)
    prompt_scenes = eval_scenes[:32]
    prompts = [shapes.captions(s)["medium"] for s in prompt_scenes]
    job = sp.proof_job(root, steps, 64, max(50, steps // 8), prompts, model="", sample_steps=20)
    t0 = time.perf_counter()
    run_job(job, [], False)
    wall = time.perf_counter() - t0
    rows = read_metrics(root / "run" / "metrics.jsonl")
    evals = [(r["step"], round(r["eval_loss"], 4)) for r in rows if r["kind"] == "eval"]
    return {
        "steps": steps,
        "minutes": wall / 60,
        "eval_loss": evals,
        "verifier": sp.score_samples(root / "run", prompt_scenes),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--every", type=int, default=10, help="async checkpoint interval")
    ap.add_argument("--proof", type=int, default=0, help="steps of ShapesWorld training (0: skip)")
    ap.add_argument("--heap-child", choices=["system", "keep"], help=argparse.SUPPRESS)
    ap.add_argument("--heap-batch", type=int, default=64, help="batch of the heap comparison")
    args = ap.parse_args()
    if args.heap_child:
        heap_child(args.heap_child, args.batch, args.steps)
        return
    from krea2.trainer.testing import write_toy_shards

    results: dict = {}
    if args.proof:  # its own section, so the overhead numbers stay
        with tempfile.TemporaryDirectory() as tmp:
            p = proof(args.proof, Path(tmp))
        md = (
            "## Trainer toy proof (`benchmarks/trainer.py --proof N`)\n\n"
            f"Toy DiT (width 128, 4 blocks, patch 4) on ShapesWorld 32x32 shards exported by"
            f" krea2.curate (one large shape, 8 colours, 3 shapes, 9 cells; 24 colour-shape-cell"
            f" combinations held out), batch 64, AdamW 1e-3, WSD, {p['steps']} steps in"
            f" {p['minutes']:.1f} min.\n\n"
            + table(["step", "held-out flow loss"], [[s_, v] for s_, v in p["eval_loss"]])
            + "\n\nRubric verifier on 32 held-out prompts (CFG 2, 20 Euler steps): "
            + ", ".join(f"{k} {v:.2f}" for k, v in p["verifier"].items())
        )
        write_results("trainer_proof", {"proof": p}, md)
        print(json.dumps(p, indent=1))
        return
    # Before anything here builds a job: init_distributed turns keep_freed_memory on for the
    # whole process, as it does in the trainer, so bare and full steps below run alike.
    heap = heap_comparison(args.heap_batch, 25)
    results["heap"] = heap
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_toy_shards(root / "shards", 2048, files=4, batch_size=args.batch, seed=0)
        skip = 5
        job = toy_job(root, args.steps, args.batch, args.every, 2)
        # Bare steps before and after the full run, so a change in machine load hits both.
        half = args.steps // 2 + skip
        before = bare_step_seconds(job, half, skip)
        full = full_step_seconds(job, skip)
        after = bare_step_seconds(job, half, skip)
        bare = {k: (before[k] + after[k]) / 2 for k in before}
        rate = loader_rate(root / "shards", args.batch, 40, workers=2)
        results["overhead"] = {
            "full": full,
            "bare": bare,
            "bare_before": before,
            "bare_after": after,
            **{f"ratio_{k}": full[k] / bare[k] for k in full},
            "target": 1.10,
            "checkpoint_every": args.every,
            "batch": args.batch,
        }
        results["loader"] = {
            "batches_per_s_2_workers": rate,
            "consumed_batches_per_s": 1 / full["wall_median"],
            "headroom": rate * full["wall_median"],
            "target": 2.0,
        }
    rows, raw = projection_rows()
    results["projection_krea2_12b_1024"] = raw
    o, ld = results["overhead"], results["loader"]
    md = [
        "## Trainer (`benchmarks/trainer.py`)",
        "",
        f"Toy DiT (width 128, 4 blocks, 32x32 PixelAE, batch {args.batch}), one process,"
        " 2 threads.",
        "",
        table(
            ["s/step", "full trainer step", "bare fwd+bwd+AdamW", "ratio", "target"],
            [
                [
                    f"{k.replace('_', ' ')}",
                    f"{o['full'][k]:.3f}",
                    f"{o['bare'][k]:.3f}",
                    f"{o[f'ratio_{k}']:.2f}x",
                    "<= 1.10x",
                ]
                for k in ("cpu_median", "cpu_mean", "wall_median", "wall_mean")
            ],
        ),
        "",
        f"Means include an async checkpoint every {args.every} steps. CPU seconds are the"
        " training process's own (robust to other load on a shared machine); wall seconds"
        " also count waiting for data. Bare steps ran before and after the full run.",
        "",
        table(
            ["loader (2 decode workers)", "batches/s", "consumed batches/s", "headroom", "target"],
            [
                [
                    "Parquet + PNG decode",
                    f"{ld['batches_per_s_2_workers']:.1f}",
                    f"{ld['consumed_batches_per_s']:.2f}",
                    f"{ld['headroom']:.1f}x",
                    ">= 2x",
                ]
            ],
        ),
        "",
        f"Malloc (`parallel.keep_freed_memory`, krea2.infra.heap): bare toy steps at batch"
        f" {args.heap_batch}, medians of 3 child processes each, run alternately:",
        "",
        table(
            ["malloc", "wall s/step", "CPU s/step", "page faults/step"],
            [
                [
                    {"system": "glibc defaults", "keep": "keep freed memory"}[mode],
                    f"{heap[mode]['wall_median']:.3f}",
                    f"{heap[mode]['cpu_median']:.3f}",
                    f"{heap[mode]['faults']:.0f}",
                ]
                for mode in ("system", "keep")
            ],
        ),
        "",
        "krea2-12b at 1024² (4096 image + 512 text tokens), global batch 1024, Muon, H200"
        " (989 TFLOP/s bf16, 40% MFU assumed); memory per rank from `krea2.trainer.projection`:",
        "",
        table(
            [
                "dp x tp",
                "AC",
                "PFLOP/step",
                "params GiB",
                "optim GiB",
                "gathered unit GiB",
                "activations GiB",
                "total GiB",
                "s/step @40%",
            ],
            rows,
        ),
    ]
    write_results("trainer", results, "\n".join(md))
    print(json.dumps(results, indent=1)[:3000])


if __name__ == "__main__":
    main()
