"""``krea2 infra``: inspect configs, metrics and checkpoints from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help=(
        "Infrastructure tools: checkpoints, metrics, GPU/fabric telemetry, Kubernetes launch.\n\n"
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
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind when serving; 0.0.0.0 inside a pod (the DaemonSet)."
    ),
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


@app.command()
def launch(
    run_file: Path = typer.Argument(..., help="A run file: the trainer's TOML with [launch]."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the manifests; apply nothing."),
    nodes: int = typer.Option(None, help="Nodes for this launch (overrides launch.nodes)."),
    overrides: list[str] = typer.Option([], "--set", help="launch.KEY=VALUE override."),
    context: str = typer.Option(None, help="kubeconfig context (default: in-cluster or current)."),
) -> None:
    """Launch a training run on Kubernetes: a JobSet of torchrun pods admitted by Kueue.

    Renders the PriorityClass and WorkloadPriorityClass, the LocalQueue, the run file as a
    ConfigMap, a headless Service for rendezvous, a PodDisruptionBudget and the JobSet;
    with reserve_nodes, picks clean nodes and labels (and taints) them first.

    Example: krea2 infra launch configs/production/krea2-12b.toml --dry-run --nodes 1
    """
    from krea2.infra.k8s.config import load_launch
    from krea2.infra.k8s.manifests import to_yaml, training_manifests

    cfg, run = load_launch(run_file, overrides, nodes)
    objects = training_manifests(cfg, run)
    if dry_run:
        if cfg.reserve_nodes:
            taint = " and tainted" if cfg.nodes >= cfg.taint_min_nodes else ""
            typer.echo(
                f"# at apply time {cfg.nodes} clean node(s) are labelled "
                f"{cfg.reservation_label}={cfg.name}{taint}"
            )
        typer.echo(to_yaml(objects), nl=False)
        return
    from krea2.infra.k8s.apply import api_client
    from krea2.infra.k8s.apply import launch as apply_launch

    for name in apply_launch(api_client(context), cfg, objects):
        typer.echo(f"applied {name}")
    typer.echo(f"run {cfg.name}: waiting for Kueue admission in queue {cfg.queue}")


@app.command()
def teardown(
    run_file: Path = typer.Argument(..., help="The run file the run was launched with."),
    overrides: list[str] = typer.Option([], "--set", help="launch.KEY=VALUE override."),
    context: str = typer.Option(None, help="kubeconfig context."),
) -> None:
    """Delete a launched run's objects and remove its node labels and taints.

    Example: krea2 infra teardown configs/production/krea2-12b.toml
    """
    from krea2.infra.k8s.apply import api_client
    from krea2.infra.k8s.apply import teardown as apply_teardown
    from krea2.infra.k8s.config import load_launch
    from krea2.infra.k8s.manifests import training_manifests

    cfg, run = load_launch(run_file, overrides)
    for name in apply_teardown(api_client(context), cfg, training_manifests(cfg, run)):
        typer.echo(f"deleted {name}")


@app.command()
def node(
    name: str = typer.Argument(..., help="Node name."),
    reason: str = typer.Option(None, help="Mark the node faulty, saying why (e.g. xid-79)."),
    clear: bool = typer.Option(False, "--clear", help="Return a repaired node to the pool."),
    label: str = typer.Option("krea2.ai/faulty", help="The faulty-node label."),
    context: str = typer.Option(None, help="kubeconfig context."),
) -> None:
    """Label a node faulty (training pods keep away, its reservation is dropped) or clear it.

    Example: krea2 infra node gpu-node-17 --reason xid-79
    """
    from krea2.infra.errors import UserError
    from krea2.infra.k8s.apply import api_client, apply_node_changes, node_states
    from krea2.infra.k8s.nodes import clear_faulty, mark_faulty

    if (reason is None) == (not clear):
        raise UserError("pass either --reason WHY (mark faulty) or --clear")
    client = api_client(context)
    states = node_states(client)
    state = next((s for s in states if s.name == name), None)
    if state is None:
        raise UserError(f"no node named {name!r} in this cluster")
    change = clear_faulty(state, label) if clear else mark_faulty(state, reason, label)
    apply_node_changes(client, [change], states)
    typer.echo(f"node {name}: {change.patch(state)}")


@app.command()
def workers(
    workers_file: Path = typer.Argument(..., help="A TOML file with a [workers] table."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the manifests; apply nothing."),
    overrides: list[str] = typer.Option([], "--set", help="workers.KEY=VALUE override."),
    context: str = typer.Option(None, help="kubeconfig context (default: in-cluster or current)."),
) -> None:
    """Deploy krablet workers autoscaled on each job's backlog (KEDA or HPA).

    Per job a worker Deployment and its scaler, the backlog exporter, and an
    interruptible priority class that training preempts.

    Example: krea2 infra workers configs/production/krablet-workers.toml --dry-run
    """
    from krea2.infra.k8s.manifests import to_yaml
    from krea2.infra.k8s.workers import load_workers, worker_manifests

    objects = worker_manifests(load_workers(workers_file, overrides))
    if dry_run:
        typer.echo(to_yaml(objects), nl=False)
        return
    from krea2.infra.k8s.apply import api_client, apply_objects

    for name in apply_objects(api_client(context), objects):
        typer.echo(f"applied {name}")


@app.command()
def monitoring(
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the manifests; apply nothing."),
    namespace: str = typer.Option("krea2-monitoring", help="Namespace of the DaemonSet."),
    image: str = typer.Option("krea2:0.1.0", help="Image with krea2-infra[gpu] installed."),
    port: int = typer.Option(9400, help="Port of each node's /metrics."),
    interval: float = typer.Option(15.0, help="Seconds between reads."),
    context: str = typer.Option(None, help="kubeconfig context (default: in-cluster or current)."),
) -> None:
    """Deploy node telemetry as a DaemonSet, with the alert rules as a ConfigMap.

    The DaemonSet runs `krea2 infra telemetry` on GPU nodes not reserved for a training
    run (launched ranks export their own GPUs), with a scrape Service.

    Example: krea2 infra monitoring --dry-run
    """
    from krea2.infra.k8s.manifests import to_yaml
    from krea2.infra.k8s.monitoring import monitoring_manifests

    objects = monitoring_manifests(namespace, image, port, interval)
    if dry_run:
        typer.echo(to_yaml(objects), nl=False)
        return
    from krea2.infra.k8s.apply import api_client, apply_objects

    for name in apply_objects(api_client(context), objects):
        typer.echo(f"applied {name}")
