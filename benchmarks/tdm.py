"""TDM's overhead: one distillation iteration against the same network passes done plainly.

    uv run --frozen python -m benchmarks.tdm [--size toy|small] [--prompts 8] [--steps 4]
                                             [--rounds 8] [--threads 1]

One ``tdm`` iteration (``krea2.rl.distill.TdmObjective``'s own pieces on one fixed batch of
``--prompts`` prompts) split into its parts: the student's rollout (K − 1 Euler steps, no
gradient), the fake-score update (the student's x̂0 at a drawn step, re-noising, importance
weights, the fake's forward, backward and AdamW step) and the student update (its forward
with gradient, the teacher's CFG forward on the doubled batch, the fake's forward, the
Pseudo-Huber loss to the DMD target, backward, AdamW step). Against it, the same network
passes done plainly on the same tensors: K + 1 no-gradient forwards of the batch, one
no-gradient forward of the doubled batch, two forward + backward passes with a squared
error and two AdamW steps. The parts alternate round by round (rotating which goes first)
so machine load hits all alike; the first round is a warm-up; medians are kept.
Target (issue #41): overhead ≤ 1.15x.

Writes benchmarks/results/tdm.json and the ``tdm`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.report import table, write_results
from benchmarks.rl import SIZES, job_config, median

TARGET = 1.15


def overhead(size: str, prompts: int, student_steps: int, rounds: int, threads: int) -> dict:
    """Median seconds of each part of a TDM iteration and of the plain passes (docstring)."""
    import numpy as np
    import torch

    from krea2.curate import shapes
    from krea2.dit import flow
    from krea2.rl.distill import FakeScore, TdmConfig, draw_points, rollout_inputs
    from krea2.rl.distill.objective import TdmObjective
    from krea2.rl.online.objective import autoencoder_of
    from krea2.trainer import DistEnv, load_stage_module

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    captions = [shapes.captions(shapes.sample_scene(rng))["medium"] for _ in range(prompts)]
    settings = TdmConfig(student_steps=student_steps)
    with tempfile.TemporaryDirectory() as tmp:
        job = job_config(Path(tmp), "tdm", Path(tmp) / "none", 1, size, 1, threads)
        student = load_stage_module(job, 0, trained=False).train()
    teacher = copy.deepcopy(student).eval().requires_grad_(False)
    env = DistEnv(0, 1, torch.device("cpu"), 1, 1, 0, None)
    stage = job.stages[0]
    fake = FakeScore.build(job, stage, env, settings, 1e-4)
    fake.load_teacher(teacher, trained_too=True)
    ae = autoencoder_of(job, torch.device("cpu"))
    side = SIZES[size][1]
    shape = (ae.latent_channels, side // ae.spatial_factor, side // ae.spatial_factor)
    noise = torch.randn((prompts, *shape), generator=torch.Generator().manual_seed(0))
    times = flow.sampling_times(student_steps, 0.5)
    objective = TdmObjective(settings, job)
    run = SimpleNamespace(module=student, reference=teacher, stage=stage)
    opt = torch.optim.AdamW(student.parameters(), lr=0.0)  # the same weights every round
    gens = [torch.Generator().manual_seed(i) for i in range(prompts)]
    points = draw_points(gens, times, shape, settings.mode, settings.intervals, True)

    def velocity(x, t):
        return student(x, t.to(x.dtype), captions)[0]

    states = rollout_inputs(velocity, noise, times)

    def sums() -> dict:
        out: dict = dict.fromkeys(("n", "loss", "dm_grad_sq", "gap", "cfg_term", "normaliser",
                                   "x0_sq", "fake_n", "fake_loss", "is_weight",
                                   "is_clipped"), 0.0)  # fmt: skip
        out["stage_loss"] = [0.0] * student_steps
        out["stage_n"] = [0.0] * student_steps
        return out

    def rollout():
        rollout_inputs(velocity, noise, times)

    def fake_update():
        objective._fake_update(fake, velocity, states, points, captions, env, prompts, sums())

    def student_update():
        objective._student_update(run, fake, states, points, captions, env, prompts, sums())
        opt.step()
        opt.zero_grad(set_to_none=True)

    t_in = torch.full((prompts,), 0.5)
    target = torch.zeros_like(noise)

    def plain_forwards():
        with torch.no_grad():
            for _ in range(student_steps + 1):  # rollout K − 1, the fake's x̂0, the fake's
                velocity(noise, t_in)
            x2 = torch.cat([noise, noise])
            teacher(x2, torch.cat([t_in, t_in]), [*captions, *[""] * prompts])

    def plain_train():
        for module, optimizer in ((student, opt), (fake.module, fake.optimizer)):
            v = module(noise, t_in, captions)[0]
            (v.float() - target).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    parts = {"rollout": rollout, "fake_update": fake_update, "student_update": student_update,
             "plain_forwards": plain_forwards, "plain_train": plain_train}  # fmt: skip
    seconds: dict[str, list[float]] = {k: [] for k in parts}
    names = list(parts)
    for r in range(rounds + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            parts[name]()
            if r:
                seconds[name].append(time.perf_counter() - t0)
    med = {k: median(v) for k, v in seconds.items()}
    tdm = med["rollout"] + med["fake_update"] + med["student_update"]
    plain = med["plain_forwards"] + med["plain_train"]
    return {"size": size, "prompts": prompts, "student_steps": student_steps, "rounds": rounds,
            "threads": threads, "seconds": med, "tdm_iteration": tdm, "plain_passes": plain,
            "overhead": tdm / plain}  # fmt: skip


def markdown(res: dict, command: str) -> str:
    s = res["seconds"]
    rows = [
        ["rollout (K − 1 Euler steps, no gradient)", f"{s['rollout'] * 1e3:.1f}"],
        ["fake-score update", f"{s['fake_update'] * 1e3:.1f}"],
        ["student update", f"{s['student_update'] * 1e3:.1f}"],
        ["**TDM iteration**", f"**{res['tdm_iteration'] * 1e3:.1f}**"],
        ["plain: K + 1 forwards, 1 doubled forward", f"{s['plain_forwards'] * 1e3:.1f}"],
        ["plain: 2 forward + backward + AdamW", f"{s['plain_train'] * 1e3:.1f}"],
        ["**the same passes, plain**", f"**{res['plain_passes'] * 1e3:.1f}**"],
    ]
    verdict = "meets" if res["overhead"] <= TARGET else "misses"
    return (
        "## Distillation: TDM iteration overhead (`benchmarks/tdm.py`)\n\n"
        f"One TDM iteration (K = {res['student_steps']}, {res['prompts']} prompts, "
        f"`{res['size']}` DiT, {res['threads']} thread(s), median of {res['rounds']} rounds) "
        f"against the same network passes done plainly on the same batch: overhead "
        f"**{res['overhead']:.2f}x** ({verdict} the ≤ {TARGET}x target).\n\n"
        + table(["part", "ms"], rows)
        + f"\n\n`{command}`"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4, help="the student's K")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    res = overhead(args.size, args.prompts, args.steps, args.rounds, args.threads)
    command = "uv run --frozen python -m benchmarks.tdm " + " ".join(sys.argv[1:])
    print(markdown(res, command.strip()))
    write_results("tdm", res, markdown(res, command.strip()))


if __name__ == "__main__":
    main()
