"""``krea2 rl distill-memory``: the memory projection of a distillation stage."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add ``distill-memory`` to ``app`` (the ``krea2 rl`` typer app)."""
    app.command("distill-memory")(distill_memory_command)


def distill_memory_command(
    model: str = typer.Option("krea2-12b", "--model", help="a krea2.dit config name"),
    side: int = typer.Option(1024, "--side", help="image side in pixels"),
    rank: int = typer.Option(64, "--rank", help="LoRA rank of the adapters"),
    batch: int = typer.Option(1, "--batch", help="prompts per GPU"),
    gpus: str = typer.Option("1,8,64", "--gpus", help="comma-separated GPU counts"),
) -> None:
    """Print the per-GPU memory projection of a TDM/DMD2 stage (teacher, student and fake
    score at once) for each student/fake-score layout under FSDP, as a Markdown table.

    Example: krea2 rl distill-memory --model krea2-12b --side 1024 --gpus 8,64
    """
    from krea2.dit.config import get_config
    from krea2.infra.errors import UserError
    from krea2.rl.distill.memory import memory_table

    try:
        counts = tuple(int(g) for g in gpus.split(",") if g.strip())
    except ValueError:
        raise UserError(f"--gpus {gpus!r} must be comma-separated whole numbers") from None
    if not counts or min(counts) < 1:
        raise UserError(f"--gpus {gpus!r} must name at least one GPU count >= 1")
    typer.echo(memory_table(get_config(model), counts, side, rank, batch))
