"""What is saved with a run: the resolved config, the code version and the environment."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from krea2.infra.config import save_config
from krea2.infra.secrets import recorded_environment


def code_version() -> dict[str, Any]:
    """Git commit and dirty flag of the checkout this code runs from, and package versions."""
    here = Path(__file__).resolve().parent
    out: dict[str, Any] = {}
    try:
        out["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=10
        ).stdout
        out["git_dirty"] = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = None
    for dist in ("krea2-trainer", "krea2-dit", "krea2-infra", "torch", "torchao"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def environment(world_size: int) -> dict[str, Any]:
    import torch

    env = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "world_size": world_size,
        "cuda": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    prefixes = ("NCCL_", "TORCH_", "CUDA_VISIBLE", "OMP_", "MASTER_", "KREA2_")
    env["vars"] = recorded_environment(prefixes)  # credentials' values hidden
    return env


def save_run_info(cfg: Any, run_dir: Path, world_size: int) -> None:
    """Write ``config.toml`` (resolved) and ``run.json`` (code version, environment)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.toml")
    info = {"code": code_version(), "environment": environment(world_size)}
    (run_dir / "run.json").write_text(json.dumps(info, indent=2) + "\n")
