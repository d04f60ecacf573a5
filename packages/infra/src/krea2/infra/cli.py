"""``krea2 infra``: inspect configs, metrics and checkpoints from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help=(
        "Infrastructure tools: checkpoints and metrics.\n\n"
        "Example: krea2 infra checkpoints runs/toy-pretrain"
    ),
    no_args_is_help=True,
)


@app.command()
def checkpoints(
    path: Path = typer.Argument(
        ..., help="A run directory, its checkpoints/ folder, or one checkpoint root."
    ),
) -> None:
    """List checkpoints under PATH (each stage's, for a run directory): step, size,
    completeness, and the ones set aside as corrupt with the reason.

    Example: krea2 infra checkpoints runs/toy-pretrain
    """
    from krea2.infra.checkpoint_layout import (
        find_checkpoint_roots,
        scan_checkpoints,
        set_aside_checkpoints,
    )

    roots = find_checkpoint_roots(path)
    if not roots:
        typer.echo(f"no checkpoints under {path} (looked for step-* folders up to 2 levels down)")
        raise typer.Exit(1)
    for root in roots:
        if roots != [path]:
            typer.echo(f"{root}:")
        for row in scan_checkpoints(root):
            state = "complete" if row.complete else f"INCOMPLETE ({row.problem})"
            typer.echo(
                f"step {row.step:>10}  {row.size_bytes / 2**20:10.1f} MiB  {state}  {row.path}"
            )
        for kept, reason in set_aside_checkpoints(root):
            typer.echo(f"set aside as corrupt: {kept} ({reason})")


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
