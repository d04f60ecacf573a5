"""Shared by the preference tests: tiny pair sets and job files, a rank launcher, and
(from krea2.trainer.held_run) a SIGKILL of a training job held at a pause point."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from krea2.rl.preference import Pair, export_pair_shards
from krea2.trainer.held_run import held_env, kill_when_held, newest_save_at
from krea2.trainer.testing import tiny_job_head

__all__ = ["COLORS", "held_env", "kill_when_held", "launch", "launch_module", "newest_save_at",
           "pair_job", "square", "toy_pairs", "write_pairs"]  # fmt: skip

COLORS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 230)}


def square(color: tuple[int, int, int], cell: int, side: int = 32) -> np.ndarray:
    img = np.zeros((side, side, 3), dtype=np.uint8)
    c = side // 3
    y, x = (cell // 3) * c, (cell % 3) * c
    img[y + 1 : y + c - 1, x + 1 : x + c - 1] = color
    return img


def toy_pairs(root: Path, n: int = 16, side: int = 32) -> list[Pair]:
    """Winners: a clean square where the prompt says; losers: the same square in another
    cell with speckle noise. PNGs under ``root``."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    pairs = []
    names = list(COLORS)
    for i in range(n):
        name, cell = names[i % 3], int(rng.integers(9))
        win = square(COLORS[name], cell, side)
        lose = square(COLORS[name], (cell + 4) % 9, side)
        lose = np.clip(lose + rng.normal(0, 40, lose.shape), 0, 255).astype(np.uint8)
        paths = []
        for role, img in (("w", win), ("l", lose)):
            p = root / f"{i}-{role}.png"
            Image.fromarray(img).save(p)
            paths.append(f"file://{p}")
        pairs.append(
            Pair(
                f"p{i:03d}",
                f"a {name} square in cell {cell}",
                *paths,
                model_step=0,
                winner_seed=2 * i,
                loser_seed=2 * i + 1,
                scores={"winner": 1.0, "loser": 0.0},
            )
        )
    return pairs


def pair_job(root: Path, shards: Path, steps: int = 6, extra: str = "", every: int = 3) -> Path:
    """A tiny deterministic preference job (toy DiT, 2 blocks, 4 pairs per step)."""
    path = root / "job.toml"
    path.write_text(
        tiny_job_head(root / "run", 0, every)
        + f"""[stability]
warmup_steps = 1000
{extra}
[[stages]]
name = "preference"
data = ["{shards}"]
init_from = "none"
steps = {steps}
batch_size = 8
caption_dropout = 0.0
lr = 1e-3
[stages.schedule]
warmup_steps = 0
"""
    )
    return path


def write_pairs(root: Path, n: int = 16) -> Path:
    out = root / "shards"
    export_pair_shards(toy_pairs(root / "png", n), out, side=32, pairs_per_batch=4)
    return out


def launch(nproc: int, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``nproc`` ranks of ``python -m krea2.rl.preference.train ARGS`` (see
    :func:`launch_module`)."""
    return launch_module(nproc, "krea2.rl.preference.train", *args, env=env)


def launch_module(
    nproc: int, module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """``nproc`` ranks of ``python -m MODULE ARGS`` with torchrun's environment (plus
    ``env``), in one new process group (one SIGKILL stops the job)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import os, subprocess, sys\n"
        "n = int(sys.argv[1]); procs = []\n"
        "for r in range(n):\n"
        "    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),\n"
        f"               LOCAL_WORLD_SIZE=str(n), MASTER_ADDR='127.0.0.1', MASTER_PORT='{port}')\n"
        f"    procs.append(subprocess.Popen([sys.executable, '-m', '{module}', *sys.argv[2:]],"
        " env=env))\n"
        "codes = [p.wait() for p in procs]\n"
        "sys.exit(next((c for c in codes if c), 0))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(nproc), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", **(env or {})),
    )
