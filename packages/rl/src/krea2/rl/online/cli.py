"""``krea2 rl grpo``: RL-tune a trained run without CFG (GRPO or DiffusionNFT)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add ``grpo`` to ``app`` (the ``krea2 rl`` typer app)."""
    app.command("grpo")(grpo_command)


def grpo_command(
    config: Path = typer.Option(None, "--config", "-c", help="RL run TOML (RlRunConfig)"),
    set_: list[str] = typer.Option(
        [], "--set", help="override, e.g. grpo.group_size=4 or steps=50 or grpo.objective=nft"
    ),
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint"),
) -> None:
    """RL-tune a stage of a krea2 train run on a prompt file: GRPO on SDE rollouts
    (per-step log-probs, ratio clipping, optional KL) or DiffusionNFT, multi-reward with
    GDPO or a weighted sum, CFG off (docs/rl.md). Several ranks: torchrun --nproc-per-node
    N -m krea2.rl.online.train CONFIG.

    Example: krea2 rl grpo --config rl.toml --set pretrained=runs/toy-pretrain
    --set prompts_file=prompts.txt --set grpo.objective=nft
    """
    from krea2.rl.online.train import run_from_config

    run = run_from_config(config, set_, resume)
    typer.echo(
        f"RL run finished: {run} (metrics.jsonl: reward_<name>, loss, ratio_mean, "
        "clip_fraction, kl, first_ratio_max_dev, time_rollout/reward/train)"
    )
