"""DiT training step: krea2.dit vs diffusers' Krea2Transformer2DModel, eager and compiled.

Same config, same random weights, same inputs (fp32 by default): forward + backward time
(min and median over interleaved rounds, so load from other processes hits every
candidate alike), peak memory of one step (CPU: peak RSS of a fresh process; CUDA:
max_memory_allocated), bytes saved for backward, and output/gradient agreement.

Run: uv run --no-sync python -m benchmarks.dit             (CPU, ~5-10 min with compile)
     uv run --no-sync python -m benchmarks.dit --no-compile --pad-frac 0.75 --area dit-padded
     uv run --no-sync python -m benchmarks.dit --device cuda --dtype bf16 --batch 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning, so CPU seconds count work, not waiting
# for cores taken by other processes (read when torch loads its OpenMP runtime).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from benchmarks.report import table, write_results
from krea2.dit.config import get_config
from krea2.dit.diffusers_config import to_diffusers_config
from krea2.dit.keymap import diffusers_to_krea
from krea2.dit.model import Krea2DiT
from krea2.dit.testing import make_inputs, randomize

IMPLS = ("ours", "diffusers")
MEMORY_IMPLS = ("ours", "ours-packed", "diffusers")


def build(args, impl: str, device: str, dtype: torch.dtype):
    """(model, step_fn) for one implementation; weights identical across implementations."""
    from diffusers import Krea2Transformer2DModel

    cfg = get_config(args.config)
    dconf = {k: v for k, v in to_diffusers_config(cfg).items() if not k.startswith("_")}
    ref = Krea2Transformer2DModel(**dconf)
    randomize(ref, seed=0, std=0.02)
    if impl.startswith("ours"):
        model = Krea2DiT(cfg)
        model.load_state_dict(diffusers_to_krea(ref.state_dict()))
        del ref
    else:
        model = ref
    model = model.to(device=device, dtype=dtype).train()
    grid = (args.image_tokens // 32, 32)
    img, txt, t, pos, mask = make_inputs(
        cfg,
        batch=args.batch,
        text_len=args.text_tokens,
        grid=grid,
        pad=(int(args.text_tokens * args.pad_frac),),
    )
    img, txt = img.to(device, dtype), txt.to(device, dtype)
    t, pos, mask = t.to(device), pos.to(device), mask.to(device)

    if impl == "ours":

        def fwd(m):
            return m(img, txt, t, pos, mask)

    elif impl == "ours-packed":

        def fwd(m):
            return m(img, txt, t, pos, mask, pack_text=True)
    else:

        def fwd(m):
            return m(img, txt, t, pos, encoder_attention_mask=mask, return_dict=False)[0]

    return model, fwd


def make_step(model, fwd, compiled: bool):
    run = torch.compile(model) if compiled else model

    def step():
        out = fwd(run)
        out.float().square().mean().backward()
        return out

    return step


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def saved_bytes(model, fwd) -> int:
    """Bytes of distinct storages autograd saves for backward in one forward."""
    seen: dict[int, int] = {}

    def pack(x):
        if isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fwd(model)
    del out
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


def child_peak(args, impl: str) -> int:
    """In this (fresh) process: peak memory of one training step above the pre-step level."""
    device, dtype = args.device, getattr(torch, args.dtype_name)
    model, fwd = build(args, impl, device, dtype)
    step = make_step(model, fwd, compiled=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    status = Path("/proc/self/status")

    def field(name: str) -> int:
        line = next(x for x in status.read_text().splitlines() if x.startswith(name + ":"))
        return int(line.split()[1]) * 1024

    base = field("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter
    step()
    return field("VmHWM") - base


def peak_memory(args, impl: str) -> int:
    cmd = [sys.executable, "-m", "benchmarks.dit", "--child-peak", impl, *sys.argv[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default="bench-512")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--text-tokens", type=int, default=256)
    p.add_argument("--pad-frac", type=float, default=0.25, help="share of text padded")
    p.add_argument("--image-tokens", type=int, default=1024)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--area", default="dit", help="results name / docs section")
    p.add_argument("--child-peak", choices=MEMORY_IMPLS, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.dtype_name = {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]
    torch.set_num_threads(args.threads)
    if args.child_peak:
        print(child_peak(args, args.child_peak))
        return
    device, dtype = args.device, getattr(torch, args.dtype_name)

    variants = [(impl, False) for impl in IMPLS] + [("ours-packed", False)]
    if not args.no_compile:
        variants += [(impl, True) for impl in IMPLS]
    models, steps, compile_s = {}, {}, {}
    for impl, compiled in variants:
        name = f"{impl} {'compiled' if compiled else 'eager'}"
        model, fwd = models.get(impl) or build(args, impl, device, dtype)
        models[impl] = (model, fwd)
        steps[name] = make_step(model, fwd, compiled)
        t0 = time.perf_counter()
        for m in (model,):
            m.zero_grad(set_to_none=True)
        steps[name]()  # warm-up (and compilation)
        steps[name]()
        sync(device)
        compile_s[name] = time.perf_counter() - t0

    # Agreement: outputs and gradients of every variant against diffusers eager.
    outs, grads = {}, {}
    for name, step in steps.items():
        model = models[name.split()[0]][0]
        model.zero_grad(set_to_none=True)
        outs[name] = step().detach().float()
        named = {k: v.grad.float() for k, v in model.named_parameters()}
        grads[name] = named if name.startswith("ours") else diffusers_to_krea(named)
    ref_o, ref_g = outs["diffusers eager"], grads["diffusers eager"]
    agree = {}
    for name in steps:
        o = ((outs[name] - ref_o).abs().max() / ref_o.abs().max()).item()
        g = max(((grads[name][k] - v).abs().max() / v.abs().max()).item() for k, v in ref_g.items())
        agree[name] = {"out_rel_err": o, "grad_rel_err": g}

    # Wall time and this process's CPU time (all threads). On a shared CPU, wall time
    # inflates with other processes' load; CPU seconds per step stay comparable.
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            models[name.split()[0]][0].zero_grad(set_to_none=True)
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            sync(device)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)

    peaks = {impl: peak_memory(args, impl) for impl in MEMORY_IMPLS}
    saved = {impl: saved_bytes(*models[impl]) for impl in MEMORY_IMPLS}
    on_cpu = device == "cpu"
    primary = cpu if on_cpu else times  # GPU: wall time (after synchronize) is the measure
    base = min(primary["diffusers eager"])
    rows, res = [], {}
    for name, ts in times.items():
        best = min(primary[name])
        res[name] = {"wall_min_s": min(ts), "wall_median_s": statistics.median(ts),
                     "cpu_min_s": min(cpu[name]), "cpu_median_s": statistics.median(cpu[name]),
                     "speedup_vs_diffusers_eager": base / best, "warmup_s": compile_s[name],
                     **agree[name]}  # fmt: skip
        err = agree[name]
        rows.append([name, f"{min(cpu[name]):.3f}", f"{min(ts):.3f}",
                     f"{statistics.median(ts):.3f}", f"{base / best:.2f}x",
                     f"{err['out_rel_err']:.1e}", f"{err['grad_rel_err']:.1e}"])  # fmt: skip
    mem_rows = [
        [impl, f"{peaks[impl] / 2**20:.0f}", f"{saved[impl] / 2**20:.0f}",
         f"{peaks[impl] / peaks['diffusers']:.2f}x"]
        for impl in MEMORY_IMPLS
    ]  # fmt: skip
    cfg = get_config(args.config)
    shape = (
        f"config `{args.config}` (width {cfg.width}, {cfg.depth} blocks, GQA {cfg.heads}/"
        f"{cfg.kv_heads}), batch {args.batch}, {args.text_tokens} text + {args.image_tokens} "
        f"image tokens ({args.pad_frac:.0%} of text padded), {args.dtype} on {device}, "
        f"{args.threads} threads"
    )
    md = "\n\n".join(
        [
            "## DiT training step"
            + ("" if args.area == "dit" else f", {args.area}")
            + " (`benchmarks/dit.py`)",
            f"Forward + backward of one step, {shape}; {args.rounds} interleaved rounds. "
            "On CPU the speedup compares process CPU seconds per step (the machine is "
            "shared; wall time is shown for reference). Target: ours ≥ 1.2x faster than "
            "diffusers eager, equal outputs; peak memory ≤ 1.0x.",
            table(
                [
                    "variant",
                    "CPU s (min)",
                    "wall s (min)",
                    "wall s (median)",
                    "speedup" + (" (CPU s)" if on_cpu else " (wall)"),
                    "out rel err",
                    "grad rel err",
                ],
                rows,
            ),
            table(
                ["impl", "peak step MiB", "saved for backward MiB", "peak vs diffusers"], mem_rows
            ),
            "`ours-packed`: `pack_text=True` drops padded text tokens before the blocks "
            "(exact up to rounding). "
            "Errors are max |a - b| / max |b| against diffusers eager with identical weights. "
            "CPU peak = peak RSS of one step in a fresh process above its pre-step RSS.",
        ]
    )
    write_results(args.area, {"shape": shape, "times": res, "peak_bytes": peaks,
                          "saved_bytes": saved}, md)  # fmt: skip
    print(md)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
