"""The prepared GPU check (one H200, under 8 minutes): DiT train step vs diffusers at the
release's width, eager and compiled, with MFU; the attention kernel alone per pinned SDPA
backend, with and without a key mask; the RL proof at a GPU budget (from a carried kit,
``benchmarks.gpu_kit``); float8 rowwise vs bf16 at 256/512 px; a LoRA
step of the full 12B on a bf16 and an int8 base with peak memory; async checkpoint blocking.

    uv run --no-sync python -m benchmarks.gpu                 # everything (needs CUDA)
    uv run --no-sync python -m benchmarks.gpu --self-check    # only the numerics check (CPU ok)

The rl part reads a pretrained model packed beforehand on a CPU machine and carried along:
``uv run python -m benchmarks.gpu_kit --demo DIR --out gpu-kit``, then the device call with
``carry=["gpu-kit"]``.

Before any timing it checks its own numerics at a small shape: our forward and gradients
against diffusers' Krea2Transformer2DModel with the same random weights (fp32, on the
device), and the device's output against the CPU's; a LoRA adapter's forward against the
same adapter merged into the base. A failed check stops the script (exit 1) before any
figure is written. Results: a ``gpu`` section of docs/benchmarks.md and
benchmarks/results/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks.gpu_attention import attention_kernels, markdown_rows
from benchmarks.gpu_rl import rl_proof
from benchmarks.report import table, write_results
from krea2.dit.config import get_config
from krea2.dit.diffusers_config import to_diffusers_config
from krea2.dit.flops import cost
from krea2.dit.keymap import diffusers_to_krea
from krea2.dit.model import Krea2DiT
from krea2.dit.testing import make_inputs, randomize

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "gpu.json"
PARTS = ("steps", "attention", "lora", "checkpoint", "rl", "float8")
CHILD_MARK = "FLOAT8-ROWS "  # the child's result line (float8_in_child)
H200_BF16_TFLOPS = 989.0  # dense bf16 peak (SXM); MFU is against this
TEXT_TOKENS = 512


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def pair(cfg, device, dtype, seed=0):
    """(ours, diffusers) with identical random weights on ``device`` in ``dtype``."""
    from diffusers import Krea2Transformer2DModel

    d = {k: v for k, v in to_diffusers_config(cfg).items() if not k.startswith("_")}
    ref = Krea2Transformer2DModel(**d)
    randomize(ref, seed, std=0.05)
    ours = Krea2DiT(cfg)
    ours.load_state_dict(diffusers_to_krea(ref.state_dict()), strict=True)
    return ours.to(device, dtype), ref.to(device, dtype)


# ------------------------------------------------------------------ numerics first
def self_check(device: torch.device) -> dict:
    """Small-shape agreement: ours vs diffusers (forward and grads, fp32, on ``device``),
    ``device`` vs CPU, and a LoRA adapter vs its merge. Raises AssertionError on a miss."""
    from krea2.trainer.config import LoraConfig
    from krea2.trainer.lora import adapter_tensors, apply_lora, merge_into

    cfg = get_config("tiny", depth=3, text_taps=12, latent_channels=16)
    out = {}
    ours, ref = pair(cfg, device, torch.float32)
    img, txt, t, pos, mask = (x.to(device) for x in make_inputs(cfg, batch=2, grid=(4, 6)))
    got = ours(img, txt, t, pos, mask)
    want = ref(img, txt, t, pos, encoder_attention_mask=mask, return_dict=False)[0]
    out["forward_vs_diffusers"] = rel_err(got, want)
    got.square().mean().backward()
    want.square().mean().backward()
    ref_grads = diffusers_to_krea({n: p.grad for n, p in ref.named_parameters()})
    out["grads_vs_diffusers"] = max(
        rel_err(p.grad, ref_grads[n]) for n, p in ours.named_parameters() if p.grad is not None
    )
    cpu_ours, _ = pair(cfg, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        cpu_out = cpu_ours(*(x.cpu() for x in (img, txt, t, pos, mask)))
        out["device_vs_cpu"] = rel_err(ours(img, txt, t, pos, mask).cpu(), cpu_out)
    base = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    apply_lora(ours, LoraConfig(rank=4, alpha=8))
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.05)  # B starts at zero; give the adapter something to do
        adapted = ours(img, txt, t, pos, mask)
        merged = Krea2DiT(cfg).to(device)
        adapter = adapter_tensors(ours.state_dict())
        merged.load_state_dict(merge_into(base, adapter, 2.0))
        out["lora_vs_merged"] = rel_err(adapted, merged(img, txt, t, pos, mask))
        out["lora_effect"] = rel_err(adapted, ref(img, txt, t, pos, mask, return_dict=False)[0])
    limits = {
        "forward_vs_diffusers": 1e-5,
        "grads_vs_diffusers": 1e-4,
        "device_vs_cpu": 1e-4,
        "lora_vs_merged": 1e-5,
    }
    for key, limit in limits.items():
        assert out[key] <= limit, f"self-check {key}: {out[key]:.2e} > {limit:.0e}"
    assert out["lora_effect"] > 1e-3, "self-check: the adapter changed nothing"
    return out


# ------------------------------------------------------------------ timed parts
def timed(step, device: torch.device, warmup: int, repeat: int) -> float:
    """Median seconds of ``step()`` after ``warmup`` calls (compile happens there)."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_step(model, inputs, impl: str, compiled: bool):
    """forward + backward of ``model`` (bf16 weights) on fixed inputs; grads dropped."""
    run = torch.compile(model) if compiled else model
    img, txt, t, pos, mask = inputs

    def step():
        if impl == "ours":
            v = run(img, txt, t, pos, mask)
        else:
            v = run(img, txt, t, pos, encoder_attention_mask=mask, return_dict=False)[0]
        v.float().square().mean().backward()
        for p in model.parameters():
            p.grad = None

    return step


def device_inputs(cfg, device, batch: int, side: int, pad: int) -> tuple:
    """make_inputs at ``side``^2 pixels (16 px per token) with 512 text tokens, ``pad`` of
    them padding: image and text tensors in bf16 on ``device``, the rest as they are."""
    grid = (side // 16, side // 16)
    raw = make_inputs(cfg, batch=batch, text_len=TEXT_TOKENS, grid=grid, pad=(pad,))
    return tuple(
        x.to(device, torch.bfloat16) if x.is_floating_point() and x.ndim >= 3 else x.to(device)
        for x in raw
    )


def release_width_steps(device, depth: int, side: int, warmup: int, repeat: int) -> list[dict]:
    """Ours vs diffusers at the release's width (6144, GQA 48/12) with ``depth`` blocks,
    ``side``^2 pixels (VAE 8 x patch 2) + 512 text tokens, batch 1, bf16, eager/compiled."""
    cfg = get_config("krea2-12b", depth=depth)
    tokens = (side // 16) ** 2
    ours, ref = pair(cfg, device, torch.bfloat16)
    inputs = device_inputs(cfg, device, 1, side, 100)
    flops = cost(cfg, 1, tokens, TEXT_TOKENS).train_flops
    rows = []
    for impl, model in (("ours", ours), ("diffusers", ref)):
        for compiled in (False, True):
            s = timed(train_step(model, inputs, impl, compiled), device, warmup, repeat)
            rows.append({"impl": impl, "compiled": compiled, "depth": depth, "side": side,
                         "step_s": s, "mfu": flops / s / (H200_BF16_TFLOPS * 1e12)})  # fmt: skip
    del ours, ref
    torch.cuda.empty_cache()
    return rows


def float8_vs_bf16(device, depth: int, warmup: int, repeat: int, compiled: bool) -> list[dict]:
    """Our step with torchao float8 rowwise Linears against bf16 at 256 and 512 px (the
    report saw 15-20 % there, compiled); the trainer's own conversion and filter. Eager
    float8 is slower than bf16 (the casts are not fused); it is measured so that a torch /
    torchao pair whose compile fails still gives a float8 figure."""
    from krea2.trainer.config import Float8Recipe
    from krea2.trainer.parallelize import apply_float8

    cfg = get_config("krea2-12b", depth=depth)
    rows = []
    for side in (256, 512):
        times = {}
        for recipe in (Float8Recipe.NONE, Float8Recipe.ROWWISE):
            torch.manual_seed(0)
            model = Krea2DiT(cfg).to(device, torch.bfloat16)
            apply_float8(model, recipe, emulate=False, fsdp=False)
            inputs = device_inputs(cfg, device, 8, side, 0)
            times[recipe.value] = timed(
                train_step(model, inputs, "ours", compiled), device, warmup, repeat
            )
            del model
            torch.cuda.empty_cache()
        rows.append({"side": side, "compiled": compiled, "bf16_s": times["none"],
                     "float8_s": times["rowwise"],
                     "speedup": times["none"] / times["rowwise"]})  # fmt: skip
    return rows


def float8_in_child(args, compiled: bool) -> list[dict]:
    """:func:`float8_vs_bf16` in a child process limited to ``args.float8_timeout`` s: a
    compile that hangs (seen with torch 2.11 + torchao 0.17: > 380 s) or crashes Inductor
    (torchao 0.18) costs that much and no more, and leaves this process's GPU state clean."""
    cmd = [sys.executable, "-m", "benchmarks.gpu", "--float8-child",
           "compiled" if compiled else "eager",
           "--depth", str(args.depth), "--repeat", str(args.repeat)]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.float8_timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"float8 ({'compiled' if compiled else 'eager'}) took more than "
                           f"{args.float8_timeout:.0f} s (--float8-timeout)") from None  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(CHILD_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"float8 child exited {done.returncode}: {done.stderr.strip()[-250:]}")
    return json.loads(lines[-1].removeprefix(CHILD_MARK))


def lora_12b_step(device, base: str, side: int, rank: int, repeat: int) -> dict:
    """One LoRA step of the full krea2-12b (meta build, random bf16 weights on the device,
    full activation checkpointing, batch 1 at ``side``^2): step time and peak memory. An
    int8 base goes through torchao's int8 weight-only quantization before peft wraps it."""
    from krea2.dit.checkpointing import set_activation_checkpointing
    from krea2.trainer.config import LoraConfig
    from krea2.trainer.lora import apply_lora

    torch.cuda.empty_cache()
    cfg = get_config("krea2-12b")
    with torch.device("meta"):
        model = Krea2DiT(cfg)
    # Cast on the meta device so the weights are born in bf16: an fp32 build of 12B
    # parameters (48 GiB) would be the peak and hide the training step's own.
    model.to(torch.bfloat16).to_empty(device=device)
    with torch.no_grad():
        model.init_weights()
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.02)
    if base == "int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        from krea2.trainer.parallelize import float8_filter

        quantize_(model, Int8WeightOnlyConfig(), filter_fn=float8_filter)
    apply_lora(model, LoraConfig(rank=rank))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # fp32 adapters, as the trainer keeps them
    set_activation_checkpointing(model, "full")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    inputs = device_inputs(cfg, device, 1, side, 100)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            v = model(*inputs)
        v.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync(device)
    resident = torch.cuda.memory_allocated(device) / 2**30  # base + adapters + inputs
    torch.cuda.reset_peak_memory_stats(device)
    s = timed(step, device, 1, repeat)
    peak = torch.cuda.max_memory_allocated(device) / 2**30  # the model is freed on return
    return {"base": base, "side": side, "rank": rank, "step_s": s, "resident_gib": resident,
            "peak_gib": peak}  # fmt: skip


def checkpoint_blocking(device, depth: int) -> dict:
    """How long ``CheckpointManager.async_save`` blocks the training thread for a
    ``depth``-block release-width model's state (bf16 on the GPU) against a sync save."""
    from krea2.infra.checkpoint import CheckpointManager

    cfg = get_config("krea2-12b", depth=depth)
    model = Krea2DiT(cfg).to(device, torch.bfloat16)
    state = {"model": model.state_dict()}
    with tempfile.TemporaryDirectory() as tmp:
        mgr = CheckpointManager(Path(tmp) / "ckpt", keep_last=2)
        t0 = time.perf_counter()
        mgr.save(0, state, {"step": 0})
        sync_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        mgr.async_save(1, state, {"step": 1})
        blocked_s = time.perf_counter() - t0
        mgr.wait()
        total_s = time.perf_counter() - t0
    gib = sum(v.numel() * v.element_size() for v in state["model"].values()) / 2**30
    return {"depth": depth, "state_gib": gib, "sync_s": sync_s, "async_blocked_s": blocked_s,
            "async_total_s": total_s}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--self-check", action="store_true", help="only the numerics check")
    p.add_argument("--depth", type=int, default=2, help="blocks at the release's width")
    p.add_argument("--side", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--parts",
        type=lambda v: set(v.split(",")),
        default=set(PARTS),
        help=f"comma-separated subset of {','.join(PARTS)}; the others keep their last figures",
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="only rewrite the docs section from benchmarks/results/gpu.json (no GPU)",
    )
    p.add_argument(
        "--float8-timeout",
        type=float,
        default=180.0,
        help="seconds allowed to each float8 mode (eager, compiled)",
    )
    p.add_argument(
        "--kit",
        type=Path,
        default=Path("gpu-kit"),
        help="the rl part's pretrained model (python -m benchmarks.gpu_kit)",
    )
    p.add_argument("--rl-seeds", type=int, default=3, help="rl part: training seeds")
    p.add_argument("--rl-steps", type=int, default=150, help="rl part: iterations per seed")
    p.add_argument("--rl-eval-every", type=int, default=30)
    p.add_argument("--rl-timeout", type=float, default=420.0, help="rl part: seconds in all")
    p.add_argument("--float8-child", choices=("eager", "compiled"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.float8_child:  # one float8 mode in a child process (float8_in_child)
        rows = float8_vs_bf16(torch.device("cuda"), args.depth, 2, args.repeat,
                              args.float8_child == "compiled")  # fmt: skip
        print(CHILD_MARK + json.dumps(rows), flush=True)
        return
    if args.render:
        results = json.loads(RESULTS.read_text())
        write_results("gpu", results, markdown(results))
        return
    if unknown := args.parts - set(PARTS):
        p.error(f"unknown parts {sorted(unknown)}: choose from {','.join(PARTS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check = self_check(device)
    print(f"self-check on {device}: " + ", ".join(f"{k} {v:.2e}" for k, v in check.items()))
    if args.self_check:
        return
    if device.type != "cuda":
        sys.exit("no CUDA device: only --self-check runs here")
    t_start = time.perf_counter()
    errors: dict[str, str] = {}

    def attempt(name: str, fn, default):
        """One part's figures; a part that fails (it has never run on this GPU) is
        reported with its error instead of losing the other parts' figures."""
        try:
            return fn()
        except Exception as exc:  # recorded, printed and written with the results
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
            print(f"{name} failed: {errors[name]}", file=sys.stderr)
            torch.cuda.empty_cache()
            return default

    def done(name: str, value):
        """Print each part as it finishes, so a run cut short still shows its figures."""
        print(f"[{time.perf_counter() - t_start:6.1f} s] {name}: {value}", flush=True)
        return value

    # Parts not asked for keep the figures of the last run (benchmarks/results/gpu.json), so
    # one part can be rerun inside a short GPU lease without losing the others.
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    measured: dict[str, str] = dict(previous.get("measured", {}))
    for name, err in previous.get("errors", {}).items():
        if name.split("-")[0] not in args.parts:
            errors[name] = err

    def part(name: str, fn, default):
        if name not in args.parts:
            return previous.get(name, default)
        measured[name] = when
        return done(name, fn())

    nan = {"state_gib": 0.0, "sync_s": float("nan"), "async_blocked_s": float("nan"),
           "async_total_s": float("nan")}  # fmt: skip
    # The compile-heavy float8 part goes last: a slow compile must not cost the others.
    steps = part("steps", lambda: attempt(
        "steps", lambda: release_width_steps(device, args.depth, args.side, 2, args.repeat), []
    ), [])  # fmt: skip
    attn = part("attention", lambda: attempt(
        "attention", lambda: attention_kernels(device, args.side, args.repeat), []
    ), [])  # fmt: skip
    lora = part("lora", lambda: [
        r
        for b in ("bf16", "int8")
        if (r := attempt(f"lora-{b}", lambda b=b: lora_12b_step(device, b, args.side, 64, 3), None))
    ], [])  # fmt: skip
    ckpt = part("checkpoint", lambda: attempt(
        "checkpoint", lambda: checkpoint_blocking(device, args.depth * 2), nan
    ), nan)  # fmt: skip
    rl = part("rl", lambda: attempt("rl", lambda: rl_proof(
        args.kit, args.rl_seeds, args.rl_steps, args.rl_eval_every, args.rl_timeout
    ), {}), {})  # fmt: skip
    fp8 = part("float8", lambda: [
        row
        for mode in (False, True)  # eager first: a figure even when the compile fails
        for row in attempt(f"float8-{'compiled' if mode else 'eager'}",
                           lambda mode=mode: float8_in_child(args, mode), [])
    ], [])  # fmt: skip
    elapsed = time.perf_counter() - t_start
    results = {"device": torch.cuda.get_device_name(device), "depth": args.depth,
               "side": args.side, "self_check": check, "steps": steps, "attention": attn,
               "float8": fp8, "lora": lora, "checkpoint": ckpt, "rl": rl, "errors": errors,
               "elapsed_s": elapsed,
               "measured": measured}  # fmt: skip
    write_results("gpu", results, markdown(results))
    print(markdown(results))


def markdown(r: dict) -> str:
    """The docs/benchmarks.md section for results ``r`` (as saved in gpu.json)."""
    depth, side, ckpt = r.get("depth", 2), r.get("side", 1024), r["checkpoint"]
    nan = float("nan")
    md = [
        f"## GPU check (`benchmarks/gpu.py`, {r.get('device', 'GPU')})",
        "",
        "Self-check first (fp32, small shape): "
        + ", ".join(f"{k} {v:.1e}" for k, v in r["self_check"].items()) + ".",
        "",
        f"Train step at width 6144, {depth} blocks, {side}² + 512 text tokens, "
        f"batch 1, bf16 (MFU against {H200_BF16_TFLOPS:.0f} TFLOP/s):",
        "",
        table(["impl", "mode", "step ms", "MFU"],
              [[s["impl"], "compiled" if s["compiled"] else "eager", f"{1e3 * s['step_s']:.1f}",
                f"{100 * s['mfu']:.1f} %"] for s in r["steps"]]),
        "",
        f"Attention alone at {side}² + 512 text tokens (GQA 48/12, head_dim 128, bf16, "
        "forward + backward), per pinned SDPA kernel (`model.attention`):",
        "",
        table(["kernel", "key mask", "ms"], markdown_rows(r["attention"]))
        if r.get("attention")
        else "not measured yet: `uv run --no-sync python -m benchmarks.gpu --parts attention`",
        "",
        "float8 rowwise vs bf16 (batch 8):",
        "",
        table(["side", "mode", "bf16 ms", "float8 ms", "speedup"],
              [[f["side"], "compiled" if f.get("compiled", True) else "eager",
                f"{1e3 * f['bf16_s']:.1f}", f"{1e3 * f['float8_s']:.1f}",
                f"{f['speedup']:.2f}x"] for f in r["float8"]]),
        "",
        f"LoRA r64 step of the full krea2-12b at {side}², full AC (resident: base, adapters "
        "and inputs before the step):",
        "",
        table(["base", "step s", "resident GiB", "peak GiB"],
              [[x["base"], f"{x['step_s']:.2f}", f"{x.get('resident_gib', nan):.1f}",
                f"{x['peak_gib']:.1f}"] for x in r["lora"]]),
        "",
        f"Checkpoint of {ckpt['state_gib']:.1f} GiB: sync {ckpt['sync_s']:.2f} s, async blocks "
        f"{ckpt['async_blocked_s']:.2f} s (done after {ckpt['async_total_s']:.2f} s).",
        "",
        rl_line(r.get("rl") or {}),
        "",
        f"Last run: {r.get('elapsed_s', nan) / 60:.1f} min. Measured: "
        + ", ".join(f"{k} {v}" for k, v in sorted(r.get("measured", {}).items())) + ".",
        *(f"- {name} failed: {err}" for name, err in r.get("errors", {}).items()),
        *(f"- {note}" for note in r.get("notes", [])),
    ]  # fmt: skip
    return "\n".join(md)


def rl_line(rl: dict) -> str:
    """The rl part's sentence (``benchmarks.gpu_rl``)."""
    if not rl:
        return (
            "RL without CFG at a GPU budget: not measured yet (`python -m benchmarks.gpu_kit"
            " --demo DIR`, then `--parts rl` with `carry=['gpu-kit']`)."
        )
    scores = ", ".join("—" if x is None else f"{x:.3f}" for x in rl["scores"])
    mean = "—" if rl["mean"] is None else f"{rl['mean']:.3f}"
    pre, nan = rl.get("pretrained", {}), float("nan")
    return (
        f"RL without CFG (the demo's [rl] recipe, {rl['steps']} iterations per seed"
        f"{'' if rl['finished'] else ', cut short by --rl-timeout'}): held-out ShapesEval "
        f"{scores} over {rl['seeds']} seeds, mean **{mean}** (target 0.95); pretrained "
        f"{pre.get('no_cfg', nan):.3f} without CFG, {pre.get('cfg', nan):.3f} with CFG 3."
    )


if __name__ == "__main__":
    main()
