"""Shared by the distillation tests: toy image and prompt shards, a job file whose stages
are flow matching then ``tdm`` (then optionally more), and reading a run's train rows."""

from __future__ import annotations

from pathlib import Path

from krea2.rl.online import export_prompt_shards
from krea2.trainer import read_metrics, write_toy_shards
from krea2.trainer.testing import tiny_job_head

__all__ = ["distill_job", "prompts", "train_rows", "write_data"]


def prompts(n: int) -> list[str]:
    """``n`` prompts in the toy shards' caption grammar (blob classes 0-7, cells 0-8)."""
    return [f"blob {i % 8} in cell {(3 * i) % 9}" for i in range(n)]


def write_data(root: Path) -> dict[str, Path]:
    """64 toy images (32 px) and 16 prompts (32 px, 4 per step)."""
    write_toy_shards(root / "images", 64, (32, 32), files=1, batch_size=8)
    export_prompt_shards(prompts(16), root / "prompts", 32, 4)
    return {"images": root / "images", "prompts": root / "prompts"}


def distill_job(
    root: Path,
    data: dict[str, Path],
    pretrain_steps: int = 2,
    tdm_steps: int = 3,
    settings: str = "",
    lr: float = 1e-4,
    every: int = 1,
    extra_stages: str = "",
    seed: int = 0,
) -> Path:
    """A toy-DiT job: ``pretrain`` (flow matching, ``pretrain_steps``) then ``turbo``
    (``tdm``, ``tdm_steps`` at ``lr``, its settings table ``settings``), then
    ``extra_stages`` (TOML); checkpoints every ``every`` steps (0: at stage ends only)."""
    path = root / "job.toml"
    path.write_text(
        tiny_job_head(root / "run", seed, every)
        + f"""[[stages]]
name = "pretrain"
data = ["{data["images"]}/*.parquet"]
init_from = "none"
steps = {pretrain_steps}
batch_size = 8
lr = 1e-3
[[stages]]
name = "turbo"
objective = "tdm"
data = ["{data["prompts"]}/*.parquet"]
steps = {tdm_steps}
batch_size = 4
lr = {lr}
[stages.schedule]
warmup_steps = 0
[stages.settings]
{settings}
{extra_stages}
"""
    )
    return path


def train_rows(run: Path) -> dict[tuple[str, int], dict]:
    """(stage, step) -> the newest train row of that step (a resume rewrites later ones)."""
    return {(r["stage"], r["step"]): r for r in read_metrics(run / "metrics.jsonl")
            if r["kind"] == "train"}  # fmt: skip
