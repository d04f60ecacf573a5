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


@app.command()
def telemetry(
    once: bool = typer.Option(False, "--once", help="Read once, print a report and exit."),
    sysfs_root: Path = typer.Option(Path("/sys"), help="Root of sysfs (for the IB counters)."),
    throttle_c: float = typer.Option(75.0, help="Temperature warning threshold (°C)."),
    gpu: list[int] = typer.Option([], help="GPU index to read (repeat); default: all."),
    interval: float = typer.Option(15.0, help="Seconds between reads when serving."),
    port: int = typer.Option(9400, help="Port of the /metrics exporter when serving."),
    host: str = typer.Option("0.0.0.0", help="Address to bind when serving."),
) -> None:
    """Read GPU (NVML) and InfiniBand (sysfs) health, export it, raise alerts.

    With --once: print temperatures, utilisation, XIDs, remapped rows, PCIe replays and
    IB errors with the alerts they warrant, then exit (1 if an alert is critical; a host
    without GPUs reports them absent and exits 0). Without: serve /metrics (the DaemonSet).

    Example: krea2 infra telemetry --once
    """
    import time

    from krea2.infra.metrics import start_exporter
    from krea2.infra.telemetry import TelemetryCollector, TelemetryConfig, format_report

    config = TelemetryConfig(
        throttle_warning_c=throttle_c,
        sysfs_root=sysfs_root,
        devices=list(gpu) or None,
        interval_s=interval,
    )
    collector = TelemetryCollector(config)
    if once:
        snap = collector.collect()
        alerts = collector.alerts(snap)
        collector.stop()
        typer.echo(format_report(snap, alerts, collector.identity))
        if any(a.severity == "critical" for a in alerts):
            raise typer.Exit(1)
        return
    server = start_exporter(port=port, host=host)
    typer.echo(f"telemetry every {interval:g} s on http://{host}:{server.port}/metrics")
    collector.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        collector.stop()
        server.close()
