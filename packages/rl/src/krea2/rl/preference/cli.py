"""``krea2 rl`` commands of the preference part: train with DPO or STPO."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the preference commands to ``app`` (the ``krea2 rl`` typer app)."""
    app.command("train-preference")(train_preference_command)
    app.command("annotate")(annotate_command)


def train_preference_command(
    config: Path = typer.Option(..., "--config", "-c", help="trainer job TOML on pair shards"),
    objective: str = typer.Option("stpo", "--objective", help="stpo or dpo"),
    beta: float = typer.Option(500.0, "--beta", help="DPO inverse temperature (per-pixel MSE)"),
    time_weight: str = typer.Option("uniform", "--time-weight", help="uniform or epsilon"),
    winner_hinge: float = typer.Option(1.0, "--winner-hinge", help="STPO λ_w"),
    loser_cap: float = typer.Option(0.1, "--loser-cap", help="STPO λ_l"),
    loser_margin: float = typer.Option(0.01, "--loser-margin", help="STPO m"),
    flow_weight: float = typer.Option(0.0, "--flow-weight", help="flow loss on the winner"),
    set_: list[str] = typer.Option([], "--set", help="job override, e.g. stages.0.steps=50"),
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint"),
) -> None:
    """Preference-optimize a DiT on pair shards (krea2 rl export-pairs) with STPO or DPO.

    Example: krea2 rl train-preference --config configs/toy/preference.toml --objective dpo
    """
    from krea2.infra.errors import UserError
    from krea2.rl.preference.loss import PreferenceConfig
    from krea2.rl.preference.train import train_preference

    try:
        pref = PreferenceConfig(
            objective, beta, time_weight, winner_hinge, loser_cap, loser_margin, flow_weight
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    run = train_preference(config, pref, set_, resume)
    typer.echo(f"preference run finished: {run} (metrics.jsonl: winner_gap, loser_gap, margin)")


def annotate_command(
    cluster: str = typer.Option(None, "--cluster", help="krablet cluster file or DSNs"),
    table: str = typer.Option("preference_pairs", "--table", help="the pairs table"),
    pairs: Path = typer.Option(None, "--pairs", help="add a preference stage's pairs.json first"),
    annotator: str = typer.Option(None, "--annotator", help="name recorded with each choice"),
    host: str = typer.Option("127.0.0.1", "--host", help="bind address (loopback by default)"),
    port: int = typer.Option(7450, "--port"),
) -> None:
    """Serve a local page to choose the better image of each pair (← → s skip, u undo).

    Example: krea2 rl annotate --cluster kb/cluster.json --pairs work/pairs.json --port 7450
    """
    import json

    import uvicorn

    from krea2.infra.errors import UserError
    from krea2.rl.preference.annotate import AnnotationSession, annotate_app
    from krea2.rl.preference.shards import Pair
    from krea2.rl.preference.table import open_pairs, write_pairs

    wh = open_pairs(cluster, table)
    if pairs is not None:
        if not pairs.is_file():
            raise UserError(f"--pairs {pairs} does not exist")
        rows = json.loads(pairs.read_text())
        rows = rows["pairs"] if isinstance(rows, dict) else rows
        typer.echo(f"added {write_pairs(wh, [Pair(**r) for r in rows], table)} pairs to {table}")
    session = AnnotationSession(wh, table, annotator)
    typer.echo(f"{len(session.pairs)} pairs to annotate: http://{host}:{port}/")
    uvicorn.run(annotate_app(session), host=host, port=port, log_level="warning")
