"""Helpers shared by the trainer tests: a tiny job config and launchers for real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from krea2.trainer.held_run import held_env, kill_when_held, newest_save_at
from krea2.trainer.testing import release_job_head, tiny_job_head

__all__ = ["held_env", "job_toml", "kill_when_held", "lora_job_toml", "newest_save_at", "ranks",
           "single", "torchrun"]  # fmt: skip


def job_toml(run_dir: Path, shards: dict[str, Path], steps: int = 10, extra: str = "") -> str:
    """A tiny deterministic job (toy DiT narrowed to 2 blocks, batch 8, 1 thread)."""
    return (
        tiny_job_head(run_dir, log_every=None)
        + f"""[stability]
warmup_steps = 1000
{extra}
[[stages]]
name = "pretrain"
data = ["{shards["train"]}"]
eval_data = ["{shards["eval"]}"]
steps = {steps}
batch_size = 8
[stages.schedule]
warmup_steps = 2
"""
    )


def torchrun(nproc: int, config: Path, *args: str, timeout: float = 300) -> subprocess.Popen:
    """Start ``python -m krea2.trainer`` under torchrun (gloo on CPU)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "krea2.trainer",
        "--config",
        str(config),
        *args,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def single(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m krea2.trainer`` in a new process group, with ``env`` added to this
    process's environment."""
    cmd = [sys.executable, "-m", "krea2.trainer", "--config", str(config), *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def ranks(
    nproc: int, config: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``nproc`` ranks directly (see launch_ranks.py); one process group for the job,
    every rank with ``env`` added to this process's environment."""
    launcher = Path(__file__).with_name("launch_ranks.py")
    cmd = [sys.executable, str(launcher), str(nproc), "--config", str(config), *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def lora_job_toml(
    run_dir: Path,
    release: Path,
    shards: dict[str, Path],
    steps: int = 6,
    extra: str = "",
    stage_extra: str = "",
) -> str:
    """A LoRA stage on a tiny release-shaped model folder (``krea2.dit.testing``'s: Qwen3-VL
    taps, Qwen-Image VAE, 12-tap DiT of width 32), built on meta, batch 4, 1 thread."""
    return (
        release_job_head(run_dir, release)
        + f"""[stability]
warmup_steps = 1000
{extra}
[[stages]]
name = "lora"
data = ["{shards["train"]}"]
steps = {steps}
batch_size = 4
init_from = "{release}"
{stage_extra}
[stages.lora]
rank = 4
alpha = 8
[stages.schedule]
warmup_steps = 1
"""
    )
