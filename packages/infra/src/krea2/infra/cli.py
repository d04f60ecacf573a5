"""``krea2 infra``: inspect configs, metrics and checkpoints from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help=(
        "Infrastructure tools: checkpoints and metrics.\n\n"
        "Example: krea2 infra checkpoints runs/toy/checkpoints"
    ),
    no_args_is_help=True,
)


@app.command()
def checkpoints(
    root: Path = typer.Argument(..., help="A checkpoint manager's root directory."),
) -> None:
    """List checkpoints under ROOT: step, completeness, size.

    Example: krea2 infra checkpoints runs/toy/checkpoints
    """
    from krea2.infra.checkpoint_layout import scan_checkpoints

    rows = scan_checkpoints(root)
    if not rows:
        typer.echo(f"no checkpoints under {root}")
        raise typer.Exit(1)
    for row in rows:
        state = "complete" if row.complete else f"INCOMPLETE ({row.problem})"
        typer.echo(f"step {row.step:>10}  {row.size_bytes / 2**20:10.1f} MiB  {state}  {row.path}")


@app.command()
def metrics(
    port: int = typer.Option(9100, help="Port of the /metrics exporter."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback by default."),
) -> None:
    """Serve this host's krea2 multiprocess metrics on /metrics until interrupted.

    Example: PROMETHEUS_MULTIPROC_DIR=/tmp/krea2-metrics krea2 infra metrics --port 9100
    """
    import time

    from krea2.infra.metrics import start_exporter

    server = start_exporter(port=port, host=host)
    typer.echo(f"serving metrics on http://{host}:{server.port}/metrics (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.close()
