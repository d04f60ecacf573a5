"""RL benchmarks: a DPO/STPO step against a plain flow-matching step, and reward throughput.

    uv run --frozen python -m benchmarks.rl [--size toy|small] [--pairs 16] [--threads 1]
                                            [--quick] [--skip-rewards]

Step time: three trainers on the same job (model, pair shards, AdamW, clipping) differ only
in their objective: plain flow matching (the trainer's own), Diffusion-DPO and STPO
(``krea2.rl.preference.PreferenceObjective``). Each runs the trainer's step
(``Trainer._train_step``: forward, backward, clipping, spike guard, optimizer step) on one
fixed batch of ``--pairs`` pairs, i.e. 2 x pairs images: the plain step trains on all of
them, a preference step runs the policy forward and backward on them and the frozen
reference forward once. They alternate step by step with the reference's forward alone
(rotating which goes first), so machine load hits all alike; warm-up rounds are dropped and
medians kept. Matmul kernels per step (torch.profiler) show where the extra time goes.

Reward throughput: ``benchmarks/rl_rewards.py``'s in-process vs HTTP comparison per reward
kind (its kill/restart run and artifact-detection check stay in that script), the wire's own
cost per request (a reward that returns zeros), and the aesthetic reward served by
``krea2 rl serve-reward`` in a process of its own.

Writes benchmarks/results/rl.json and the ``rl`` section of docs/benchmarks.md.

GRPO iteration (``--grpo-only``, or after the rest): one ``krea2.rl.online`` iteration on the
toy DiT split into rollout (SDE window with per-step log-probabilities), reward (the
ShapesWorld rubric in-process) and training (the window's clipped-ratio loss, backward,
AdamW step), against the bare Euler sampler and a bare flow-matching step on the same
window states, alternating per round. Writes benchmarks/results/rl-grpo.json and the
``rl-grpo`` section.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np

from benchmarks.report import table, write_results

TARGET = 2.2  # preference step / plain flow step
# name -> (DiT overrides of the "toy" config, image side, rounds of steps by default):
# "toy" is benchmarks/trainer.py's model (width 128, 4 blocks, patch 4 on 32x32 pixels,
# about 0.35 CPU s per plain step of 32 images); "small" is twice as wide and deep on 64x64
# images (4x the tokens, about 7 CPU s per plain step).
SIZES = {
    "toy": ({}, 32, 40),
    "small": (
        {"width": 256, "depth": 8, "heads": 4, "kv_heads": 2, "mlp_hidden": 1024},
        64,
        8,
    ),
}
KINDS = ("plain", "dpo", "stpo")


def median(xs: list[float]) -> float:
    return float(np.median(xs))


def pair_shards(root: Path, pairs: int, side: int) -> Path:
    """``pairs`` ShapesWorld pairs as shards (one batch): the winner a clean render of its
    prompt's scene, the loser another scene with speckle noise."""
    from PIL import Image

    from krea2.curate import shapes
    from krea2.rl.preference import Pair, export_pair_shards

    rng = np.random.default_rng(0)
    (root / "png").mkdir(parents=True)
    out = []
    for i in range(pairs):
        scene, other = shapes.sample_scene(rng), shapes.sample_scene(rng)
        win = shapes.render(scene, side, side)
        lose = shapes.render(other, side, side).astype(np.float32)
        lose = np.clip(lose + rng.normal(0, 30, lose.shape), 0, 255).astype(np.uint8)
        uris = []
        for role, img in (("w", win), ("l", lose)):
            path = root / "png" / f"{i}-{role}.png"
            Image.fromarray(img).save(path)
            uris.append(f"file://{path}")
        prompt = shapes.captions(scene)["medium"]
        out.append(Pair(f"p{i:03d}", prompt, *uris, model_step=0, winner_seed=0, loser_seed=1))
    export_pair_shards(out, root / "shards", side=side, pairs_per_batch=pairs)
    return root / "shards"


def job_config(
    root: Path, kind: str, shards: Path, pairs: int, size: str, steps: int, threads: int
):
    from krea2.trainer import load_job

    overrides = SIZES[size][0]
    model = "".join(f"{k} = {v}\n" for k, v in overrides.items())
    path = root / f"{kind}.toml"
    path.write_text(f"""
run_dir = "{root / kind}"
seed = 0
[model]
name = "toy"
[model.overrides]
{model}
[text]
max_tokens = 24
[parallel]
threads = {threads}
[data]
workers = 0
[checkpoint]
every = 0
[stability]
warmup_steps = 100000
[[stages]]
name = "bench"
data = ["{shards}"]
init_from = "none"
steps = {steps}
batch_size = {2 * pairs}
caption_dropout = 0.0
lr = 1e-4
[stages.schedule]
warmup_steps = 0
""")
    return load_job(path)


def _matmuls(fn) -> int:
    """Matrix-multiply kernels (mm, addmm, bmm) that one call of ``fn`` runs, backward
    included (counted below autograd, where linear layers have become these kernels)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = {"mm", "addmm", "bmm"}

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.overloadpacket.__name__ in names
            return func(*args, **(kwargs or {}))

    with Count() as count:
        fn()
    return count.n


def step_times(size: str, pairs: int, steps: int, skip: int, threads: int) -> dict:
    """Wall and CPU seconds per trainer step of each objective (and of the reference's
    forward alone), alternating step by step; medians after ``skip`` warm-up rounds."""
    import torch

    from krea2.rl.preference import PreferenceConfig, PreferenceObjective
    from krea2.trainer import Trainer
    from krea2.trainer.data import batch_loader

    objectives = {
        "plain": None,
        "dpo": PreferenceObjective(PreferenceConfig(kind="dpo")),
        "stpo": PreferenceObjective(PreferenceConfig(kind="stpo")),
    }
    kinds = (*KINDS, "reference")
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    losses: dict[str, list[float]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shards = pair_shards(root, pairs, SIZES[size][1])
        trainers, runs = {}, {}
        for kind, objective in objectives.items():
            cfg = job_config(root, kind, shards, pairs, size, steps + 1, threads)
            trainer = Trainer(cfg, objective=objective)
            index, _ = trainer._indexes(0, cfg.stages[0])
            trainers[kind], runs[kind] = trainer, trainer._resume_or_init(0, cfg.stages[0], index)
        batch = next(iter(batch_loader(runs["plain"].data, 0, 1, 0, 1, 0, 1)))
        ref = runs["dpo"].reference
        with torch.no_grad():
            x = trainers["dpo"].ae.encode(batch["pixels"].float() / 127.5 - 1.0)
        x_t = torch.randn_like(x).to(next(ref.dit.parameters()).dtype)
        t = torch.rand(x.shape[0]).to(x_t.dtype)
        captions = [c[0]["text"] for c in batch["captions"]]

        def ref_forward() -> None:
            with torch.no_grad():
                ref(x_t, t, captions)

        def train_step(kind: str, step: int):
            return lambda: trainers[kind]._train_step(runs[kind], batch, step)

        for step in range(steps):
            order = kinds[step % len(kinds) :] + kinds[: step % len(kinds)]
            for kind in order:
                t0, c0 = time.perf_counter(), time.process_time()
                if kind == "reference":
                    ref_forward()
                else:
                    out, _ = trainers[kind]._train_step(runs[kind], batch, step)
                    losses[kind].append(out["loss"])
                if step >= skip:
                    wall[kind].append(time.perf_counter() - t0)
                    cpu[kind].append(time.process_time() - c0)
        matmuls = {k: _matmuls(train_step(k, steps)) for k in KINDS}
        matmuls["reference"] = _matmuls(ref_forward)
        params = sum(p.numel() for p in runs["plain"].module.parameters())
        threads = torch.get_num_threads()
    res: dict = {
        "size": size,
        "image_side": SIZES[size][1],
        "dit_overrides": SIZES[size][0],
        "params": params,
        "pairs": pairs,
        "images": 2 * pairs,
        "rounds": steps,
        "warmup_rounds": skip,
        "threads": threads,
        "target": TARGET,
        "matmuls_per_step": matmuls,
    }
    for kind in kinds:
        res[kind] = {
            "wall_median": median(wall[kind]),
            "cpu_median": median(cpu[kind]),
            "wall_min": min(wall[kind]),
            "wall": wall[kind],
            "cpu": cpu[kind],
        }
        if kind in losses:
            res[kind]["first_losses"] = losses[kind][:3]
    for kind in ("dpo", "stpo", "reference"):
        for k in ("wall", "cpu"):
            res[f"ratio_{kind}_{k}"] = res[kind][f"{k}_median"] / res["plain"][f"{k}_median"]
            xs = wall if k == "wall" else cpu
            paired = [a / b for a, b in zip(xs[kind], xs["plain"], strict=True)]
            res[f"paired_{kind}_{k}"] = median(paired)
    return res


def step_markdown(s: dict) -> list[str]:
    names = {
        "plain": "plain flow matching",
        "dpo": "Diffusion-DPO",
        "stpo": "STPO",
        "reference": "(reference forward alone, no grad)",
    }
    rows = []
    for kind, name in names.items():
        r = s[kind]
        if kind == "plain":
            ratios = ["1.00x", "1.00x", "1.00x", ""]
        else:
            ratios = [
                f"{s[f'ratio_{kind}_wall']:.2f}x",
                f"{s[f'paired_{kind}_wall']:.2f}x",
                f"{s[f'ratio_{kind}_cpu']:.2f}x",
                "" if kind == "reference" else f"<= {TARGET}x",
            ]
        rows.append(
            [
                name,
                f"{r['wall_median']:.3f}",
                f"{r['cpu_median']:.3f}",
                *ratios,
                s["matmuls_per_step"][kind],
            ]
        )
    over = s["dit_overrides"]
    model = "toy recipe" + ("".join(f", {k} {v}" for k, v in over.items()) if over else "")
    side = s["image_side"]
    m = s["matmuls_per_step"]
    threads = (
        "1 thread (on a shared 2-core machine two OpenMP threads stall on each other "
        "whenever another job takes a core; one thread's CPU seconds are the step's own work)"
        if s["threads"] == 1
        else f"{s['threads']} threads"
    )
    return [
        f"Step time (`--size {s['size']}`): DiT {model} ({s['params'] / 1e6:.2f} M parameters "
        f"with the word conditioner), {side}x{side} PixelAE pixels, {s['pairs']} ShapesWorld "
        f"pairs = {s['images']} images per batch, AdamW, {threads}. Each objective "
        "runs the trainer's step (`Trainer._train_step`: forward, backward, clipping, spike "
        "guard, optimizer step) on the same batch: the plain step trains flow matching on all "
        f"{s['images']} images, a preference step runs the policy forward + backward on them "
        "(winners and losers in one batch) and the frozen reference forward once, without "
        f"grad. The objectives alternate step by step (rotating which goes first); medians of "
        f"{s['rounds'] - s['warmup_rounds']} steps each after {s['warmup_rounds']} warm-up "
        "rounds. *paired*: the median of each round's ratio.",
        "",
        table(
            [
                "objective",
                "wall s/step",
                "CPU s/step",
                "wall / plain",
                "paired",
                "CPU / plain",
                "target",
                "matmul kernels/step",
            ],
            rows,
        ),
        "",
        f"Where the extra time goes: a preference step's matmul kernels are {m['dpo']} = the "
        f"plain step's {m['plain']} + the reference forward's {m['reference']}"
        f"{'' if m['dpo'] == m['plain'] + m['reference'] else ' (NOT equal: look into it)'}, "
        f"and its CPU time is close to the plain step's + the reference forward's "
        f"({s['plain']['cpu_median']:.3f} + {s['reference']['cpu_median']:.3f} = "
        f"{s['plain']['cpu_median'] + s['reference']['cpu_median']:.3f} s vs "
        f"{s['dpo']['cpu_median']:.3f} s DPO, {s['stpo']['cpu_median']:.3f} s STPO). "
        "Nothing is computed twice: winners and losers go through one batched forward per "
        "module, the reference runs under no_grad (no graph kept), and each module conditions "
        "on the captions once. The CPU column is the load-robust one on a shared machine.",
    ]


class _Zero:
    """A reward that scores every image 0 at no cost: what is left of an HTTP request's
    time is the wire's (encoding, HTTP, batching), client and server together."""

    name = "zero"

    def __call__(self, images, prompts):
        from krea2.rl.rewards import RewardOutput

        return RewardOutput(np.zeros(len(prompts), np.float32), {})


def wire_cost(rr, images, prompts, batch: int, clients: int, n: int = 128) -> dict:
    """Wall and CPU (this process: clients and server) milliseconds per request of
    ``batch`` images to a reward that returns zeros, with the binary body and with base64
    pixels in JSON, alternately (3 rounds, medians); and the base64 + JSON encoding and
    decoding of one request alone."""
    from krea2.rl.rewards.wire import decode_request, encode_images

    config = rr.ServerConfig(max_batch=batch, max_wait_ms=5, token="bench")
    runs: dict[str, list[dict]] = {"binary": [], "json": []}
    with rr.ServerThread(_Zero(), config=config) as server:
        url = server.url
        for r in range(3):
            for body in ("binary", "json") if r % 2 == 0 else ("json", "binary"):
                binary = body == "binary"
                out = rr.drive(url, "bench", images, prompts, batch, n, clients, binary=binary)
                runs[body].append(out)

    def encode() -> str:
        return json.dumps({"prompts": prompts[:batch], "images": encode_images(images[:batch])})

    encoded = encode()

    def best_ms(fn) -> float:
        return 1000 * min(timeit.repeat(fn, number=20, repeat=5)) / 20

    res: dict = {}
    for body, rs in runs.items():
        res[f"{body}_wall_ms"] = median([1000 * batch / r["images_per_s"] for r in rs])
        res[f"{body}_cpu_ms"] = median([1000 * r["cpu_s"] / n for r in rs])
    res["json_encode_ms"] = best_ms(encode)  # the client's base64 + JSON of one request
    res["json_decode_ms"] = best_ms(lambda: decode_request(json.loads(encoded)))  # server's
    return res


@contextlib.contextmanager
def served(kind: str, batch: int):
    """``krea2 rl serve-reward --kind KIND`` in a process of its own (token ``bench``, max
    batch ``batch``), for as long as the block runs; yields its URL once it answers."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "krea2.rl.rewards.cli", "serve-reward", "--kind", kind]
    cmd += ["--port", str(port), "--max-batch", str(batch)]
    env = {**os.environ, "KREA2_REWARD_TOKEN": "bench"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    failed = f"the reward server ({' '.join(cmd)}) did not start"
                    raise RuntimeError(failed) from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait()


def rewards(quick: bool, batch: int, clients: int, rounds: int) -> tuple[dict, list[str]]:
    """benchmarks/rl_rewards.py's throughput comparison, plus the wire's own cost."""
    from benchmarks import rl_rewards as rr

    calls = 8 if quick else 32
    images, prompts = rr._batch(256, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        kinds, _ = rr.reward_kinds(quick, prompts, Path(tmp))
        per_kind, rows = rr.throughput(kinds, images, batch, calls, clients, rounds)
        aesthetic = kinds["aesthetic"][0]
        with served(f"aesthetic:{Path(tmp) / 'a.npz'}", batch) as url:
            apart = rr.compare(aesthetic, images, prompts, batch, calls, clients, rounds, url)
    wire = wire_cost(rr, images, prompts, batch, clients)
    aest = per_kind["aesthetic"]["in_process"]["images_per_s"]
    share = wire["binary_wall_ms"] / (1000 * batch / aest)
    res = {"batch": batch, "clients": clients, "rounds": rounds, "kinds": per_kind}
    res["wire"] = wire
    res["aesthetic_served_apart"] = apart
    a, b = apart["in_process"], apart["http"]
    rows.append(
        [
            "aesthetic, server in its own process",
            f"{a['images_per_s']:.0f}",
            f"{b['images_per_s']:.0f}",
            f"{apart['ratio']:.2f}",
            f"{a['p50_ms']:.0f} / {a['p99_ms']:.0f}",
            f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f}",
        ]
    )
    md = [
        "Reward throughput (`benchmarks/rl_rewards.py`'s measurement): "
        + rr.throughput_note(batch, clients, rounds),
        "",
        table(rr.THROUGHPUT_HEADERS, rows),
        "",
        f"What HTTP costs: a reward that returns zeros takes {wire['binary_wall_ms']:.1f} ms "
        f"wall and {wire['binary_cpu_ms']:.1f} ms CPU per {batch}-image request (client and "
        "server together) with the binary body `RewardClient` sends, against "
        f"{wire['json_wall_ms']:.1f} ms and {wire['json_cpu_ms']:.1f} ms with base64 pixels "
        f"in JSON (base64 + JSON alone: {wire['json_encode_ms']:.2f} ms to encode, "
        f"{wire['json_decode_ms']:.2f} ms to decode); {100 * share:.0f}% of the aesthetic "
        f"reward's own time per {batch}-image batch. Beyond base64 + JSON, a request costs "
        "Python's HTTP stack (h11, Starlette/FastAPI, asyncio, the hand-off to the reward "
        "thread and back), paid per request rather than per image: cheap rewards on small "
        "images lose the most, bigger requests win it back. The clients are built and "
        "connected before the clock starts (an httpx client takes ~20 ms to build; four of "
        "them would be ~8% of a one-second run). The last row serves the aesthetic head with "
        "`krea2 rl serve-reward` in a process of its own (the real layout: the trainer's "
        "sampler is the client). The aesthetic and artifact rewards run the same image "
        "features at the same cost, so a gap between their ratios is load noise.",
    ]
    return res, md


GRPO_TARGET = 1.15  # (rollout + GRPO training) / (bare sampler + bare training step)


def grpo_overhead(
    size: str, prompts: int, group: int, sample_steps: int, window: int, rounds: int,
    threads: int,
) -> dict:  # fmt: skip
    """Median seconds of each part of a GRPO iteration and of its bare counterparts on the
    same batch (module docstring); the first round is a warm-up, not counted."""
    import torch

    from krea2.curate import shapes
    from krea2.dit import euler_sample, flow, to_uint8
    from krea2.rl.online import grpo_terms, sde_rollout, step_log_prob
    from krea2.rl.online.objective import autoencoder_of
    from krea2.rl.rewards import ShapesRubricReward
    from krea2.trainer import load_stage_module

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    texts = [shapes.captions(shapes.sample_scene(rng))["medium"] for _ in range(prompts)]
    captions = [p for p in texts for _ in range(group)]
    n = len(captions)
    with tempfile.TemporaryDirectory() as tmp:
        job = job_config(Path(tmp), "grpo", Path(tmp) / "none", 1, size, 1, threads)
        module = load_stage_module(job, 0, trained=False).train()
    ae = autoencoder_of(job, torch.device("cpu"))
    side = SIZES[size][1]
    shape = (ae.latent_channels, side // ae.spatial_factor, side // ae.spatial_factor)
    noise = torch.randn((n, *shape), generator=torch.Generator().manual_seed(0))
    times = flow.sampling_times(sample_steps, 0.5)
    steps = list(range(1, 1 + window))
    opt = torch.optim.AdamW(module.parameters(), lr=0.0)  # the same weights every round
    reward = ShapesRubricReward(ocr=False)
    adv = torch.randn(n, generator=torch.Generator().manual_seed(1))

    def velocity(x, t):
        return module(x, t.to(x.dtype), captions)[0]

    def bare_sample():
        return euler_sample(velocity, noise, times)

    def rollout():
        gens = [torch.Generator().manual_seed(i) for i in range(n)]
        return sde_rollout(velocity, noise, times, steps, 0.7, gens)

    ro = rollout()

    def rewards():
        with torch.no_grad():
            images = to_uint8(ae.decode(ro.x0)).numpy()
        return reward(images, captions)

    def bare_train():
        for k in range(window):
            x, t = ro.states[k], float(times[ro.window[k]])
            v = velocity(x, torch.full((n,), t))
            (v.float() - ro.next_states[k]).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def grpo_train():
        for k in range(window):
            logp, _ = step_log_prob(velocity, ro, k, slice(0, n))
            loss, _, _ = grpo_terms(logp, ro.log_probs[k], adv, 0.01)
            loss.mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    parts = {"bare_sample": bare_sample, "rollout": rollout, "reward": rewards,
             "bare_train": bare_train, "grpo_train": grpo_train}  # fmt: skip
    times_s: dict[str, list[float]] = {k: [] for k in parts}
    names = list(parts)
    for r in range(rounds + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
            t0 = time.perf_counter()
            parts[name]()
            if r:
                times_s[name].append(time.perf_counter() - t0)
    med = {k: median(v) for k, v in times_s.items()}
    bare = med["bare_sample"] + med["bare_train"]
    return {
        "images": n, "prompts": prompts, "group": group, "sample_steps": sample_steps,
        "window": window, "rounds": rounds, "size": size, "seconds": med,
        "overhead": (med["rollout"] + med["grpo_train"]) / bare,
        "overhead_with_reward": (med["rollout"] + med["reward"] + med["grpo_train"]) / bare,
        "rollout_vs_sampler": med["rollout"] / med["bare_sample"],
        "train_vs_step": med["grpo_train"] / med["bare_train"],
    }  # fmt: skip


def grpo_markdown(g: dict, command: str) -> str:
    sec = g["seconds"]
    rows = [
        ["rollout (SDE window, log-probs)", f"{sec['rollout']:.3f}", "bare Euler sampler",
         f"{sec['bare_sample']:.3f}", f"{g['rollout_vs_sampler']:.3f}x"],
        ["GRPO training (window, clipped ratio)", f"{sec['grpo_train']:.3f}",
         "bare flow-matching step on the same states", f"{sec['bare_train']:.3f}",
         f"{g['train_vs_step']:.3f}x"],
        ["reward (rubric, in-process)", f"{sec['reward']:.3f}", "", "", ""],
    ]  # fmt: skip
    verdict = "within" if g["overhead"] <= GRPO_TARGET else "over"
    return (
        "## RL: GRPO iteration overhead (`benchmarks/rl.py --grpo-only`)\n\n"
        f"`{command}`\n\n"
        f"One iteration on the {g['size']} DiT: {g['prompts']} prompts x {g['group']} images, "
        f"{g['sample_steps']} sampling steps with a {g['window']}-step SDE window; medians of "
        f"{g['rounds']} rounds, parts rotated per round.\n\n"
        + table(["GRPO part", "s", "bare counterpart", "s", "ratio"], rows)
        + f"\n\nOverhead (rollout + GRPO training) / (sampler + training step): "
        f"**{g['overhead']:.3f}x**, {verdict} the {GRPO_TARGET}x target; with the reward "
        f"call: {g['overhead_with_reward']:.3f}x (the reward is work the bare pair does not do)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="toy")
    ap.add_argument("--pairs", type=int, default=16, help="pairs per batch (2x images)")
    ap.add_argument("--steps", type=int, default=0, help="rounds of steps (0: by size)")
    ap.add_argument("--skip-rewards", action="store_true", help="step time only")
    ap.add_argument("--quick", action="store_true", help="fewer steps and reward calls")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the steps")
    ap.add_argument("--batch", type=int, default=16, help="images per reward request")
    ap.add_argument("--clients", type=int, default=4, help="concurrent reward clients")
    ap.add_argument("--rounds", type=int, default=3, help="reward in-process/HTTP rounds")
    ap.add_argument("--grpo-only", action="store_true", help="only the GRPO iteration")
    ap.add_argument("--grpo-rounds", type=int, default=6, help="GRPO iteration rounds")
    args = ap.parse_args()
    command = " ".join(["uv run --frozen python -m benchmarks.rl", *sys.argv[1:]])
    g = grpo_overhead(args.size, 4, 8, 8, 2, args.grpo_rounds, args.threads)
    print(json.dumps(g, indent=1), flush=True)
    write_results("rl-grpo", {"command": command, **g}, grpo_markdown(g, command))
    if args.grpo_only:
        return
    steps = args.steps or SIZES[args.size][2] // (4 if args.quick else 1)
    skip = min(3, steps // 4)  # warm-up rounds, not counted
    command = " ".join(["uv run --frozen python -m benchmarks.rl", *sys.argv[1:]])
    t0 = time.perf_counter()
    load = [os.getloadavg()[0]]  # 1-minute load averages along the run, for the reader
    s = step_times(args.size, args.pairs, steps, skip, args.threads)
    load.append(os.getloadavg()[0])
    brief = {k: v for k, v in s.items() if k.startswith(("ratio", "paired"))}
    print(json.dumps(brief, indent=1), flush=True)
    results: dict = {"command": command, "step_time": s}
    md = [
        "## RL: preference step time and reward throughput (`benchmarks/rl.py`)",
        "",
        f"`{command}`",
        "",
        *step_markdown(s),
    ]
    if not args.skip_rewards:
        r, rmd = rewards(args.quick, args.batch, args.clients, args.rounds)
        load.append(os.getloadavg()[0])
        results["rewards"] = r
        md += ["", *rmd]
    results["minutes"] = (time.perf_counter() - t0) / 60
    results["load_average_1min"] = load
    md += [
        "",
        f"Whole run: {results['minutes']:.1f} min; the machine's 1-minute load average "
        f"(other jobs included) at the start, after the steps"
        f"{', after the rewards' if len(load) > 2 else ''}: {', '.join(f'{x:.1f}' for x in load)}.",
    ]
    write_results("rl", results, "\n".join(md))


if __name__ == "__main__":
    main()
