"""``krea2 rl``: each part of the package registers its own commands."""

from __future__ import annotations

import typer

from krea2.rl.distill import cli as distill_cli
from krea2.rl.online import cli as grpo_cli
from krea2.rl.preference import cli as preference_cli
from krea2.rl.rewards import cli as rewards_cli

app = typer.Typer(
    name="rl",
    help=(
        "Rewards, reward servers, preference pairs and preference optimization, GRPO, "
        "distillation.\n\n"
        "Example: krea2 rl serve-reward --kind rubric --port 7440"
    ),
    no_args_is_help=True,
    add_completion=False,
)
rewards_cli.register(app)
preference_cli.register(app)
grpo_cli.register(app)
distill_cli.register(app)
