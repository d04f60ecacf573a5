"""``krea2 krablet``: start shards, show status, run workers, the funnel and the RPC server."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from krea2.infra.errors import UserError

app = typer.Typer(
    help="The sharded PostgreSQL warehouse.\n\nExample: krea2 krablet up --shards 2 --data /tmp/kb",
    no_args_is_help=True,
)

CLUSTER_HELP = (
    "Cluster file written by `up`, or DSNs separated by commas (default: $KRABLET_CLUSTER)."
)


def _warehouse(cluster: str | None):
    from krea2.krablet.cluster import default_cluster_source
    from krea2.krablet.warehouse import Warehouse

    return Warehouse.open(default_cluster_source(cluster))


@app.command()
def up(
    shards: int = typer.Option(2, help="Number of embedded shards."),
    data: Path = typer.Option(..., help="Directory for the shards' data (one sub-directory each)."),
    cluster_file: Path = typer.Option(
        None, "--cluster-file", help="Where to write the cluster file (default: DATA/cluster.json)."
    ),
) -> None:
    """Start N embedded PostgreSQL 16 shards (pgserver) and write a cluster file.

    Running it again reuses the data and restarts stopped shards; the secret is kept.

    Example: krea2 krablet up --shards 2 --data /tmp/kb
    (then: export KRABLET_CLUSTER=/tmp/kb/cluster.json)
    """
    from krea2.krablet.cluster import Cluster, load_cluster
    from krea2.krablet.embedded import up as start

    path = cluster_file or data / "cluster.json"
    old = load_cluster(path) if path.exists() else None
    if old is not None and old.embedded and old.embedded.get("shards") != shards:
        raise UserError(
            f"{path} describes {old.embedded.get('shards')} shards, not {shards}: rows are placed "
            "by shard count, so it cannot change; use another --data directory"
        )
    dsns = start(shards, data)
    cluster = Cluster(
        dsns,
        secret=old.secret if old else Cluster(dsns).secret,
        embedded={"data": str(data.resolve()), "shards": shards},
    )
    cluster.save(path)
    typer.echo(f"{shards} shard(s) running under {data}; cluster file: {path}")
    typer.echo(f"next: export KRABLET_CLUSTER={path}; krea2 krablet status")


@app.command()
def down(data: Path = typer.Option(..., help="The --data directory given to `up`.")) -> None:
    """Stop the embedded shards under DATA (the data is kept).

    Example: krea2 krablet down --data /tmp/kb
    """
    from krea2.krablet.embedded import down as stop

    typer.echo(f"stopped {stop(data)} shard(s)")


@app.command()
def status(
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Shards, tables, row counts and queue backlogs.

    Example: krea2 krablet status --cluster /tmp/kb/cluster.json
    """
    from krea2.krablet.cluster import redact

    wh = _warehouse(cluster)
    st = wh.status()
    if as_json:
        typer.echo(json.dumps(st, indent=2, default=str))
        return
    for i, entry in enumerate(st["shards"]):
        dsn = redact(wh.cluster.shards[i])
        if not entry["ok"]:
            typer.echo(f"shard {i}  DOWN  {dsn}: {entry['error']}")
            continue
        typer.echo(f"shard {i}  up  {dsn}")
        for name, t in entry["tables"].items():
            typer.echo(f"  {name}: {t['rows']} rows")
            for job, q in t["jobs"].items():
                typer.echo(
                    f"    job {job}: ready {q['ready']}, leased {q['leased']}, backing off "
                    f"{q['backing_off']}, oldest ready {q['oldest_ready_s']:.1f}s"
                )
    if not wh.tables:
        typer.echo("no tables declared yet")
    typer.echo(
        "schema: identical on all shards"
        if st["schema_consistent"]
        else "schema: DIFFERS between shards (run the migration again)"
    )
    wh.close()


@app.command()
def worker(
    job: str = typer.Option(None, help="TABLE.JOB to run, e.g. images.ocr."),
    handler: str = typer.Option(
        None, help="module:function (or file.py:function); default: the job's declared handler."
    ),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
    batch_size: int = typer.Option(32, help="Rows per claim."),
    concurrency: int = typer.Option(1, help="Batches processed at once (threads)."),
    lease_s: float = typer.Option(None, help="Lease length in seconds (default: the job's)."),
    until_empty: bool = typer.Option(False, help="Exit once no shard has ready or leased rows."),
    pluck: bool = typer.Option(False, "--pluck", help="Run signed pluck jobs instead of --job."),
    metrics_port: int = typer.Option(None, help="Serve /metrics on this port (loopback)."),
) -> None:
    """Run a job's handler over the cluster; SIGTERM finishes or releases claims and exits.

    Example: krea2 krablet worker --job images.ocr --handler mypkg.ocr:run --batch-size 64
    """
    from krea2.krablet.worker import Worker, resolve_handler

    wh = _warehouse(cluster)
    if metrics_port is not None:
        from krea2.infra.metrics import start_exporter

        start_exporter(port=metrics_port)
    if pluck:
        from krea2.krablet.pluck_worker import PluckWorker

        pw = PluckWorker(wh, concurrency=concurrency, lease_s=lease_s)
        stats = pw.run(until_empty=until_empty, install_signals=True)
        typer.echo(
            f"pluck worker {pw.owner} done: {stats.completed} ranges completed, {stats.failed} "
            f"failed ({pw.runner.refused} refused), {stats.released} released"
        )
        wh.close()
        return
    if not job or "." not in job:
        raise UserError("--job must be TABLE.JOB, e.g. --job images.ocr (or pass --pluck)")
    table, _, name = job.partition(".")
    spec = handler or wh.table(table).job(name).handler
    if not spec:
        raise UserError(f"job {job} declares no handler; pass --handler module:function")
    w = Worker(
        wh,
        table,
        name,
        resolve_handler(spec),
        batch_size=batch_size,
        concurrency=concurrency,
        lease_s=lease_s,
    )
    stats = w.run(until_empty=until_empty, install_signals=True)
    typer.echo(
        f"worker {w.owner} done: {stats.completed} completed, {stats.failed} failed, "
        f"{stats.released} released, {stats.lost} lost leases"
    )
    wh.close()


def _serve(app, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning")


@app.command()
def funnel(
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind (a non-loopback one needs --token)."
    ),
    port: int = typer.Option(7431, help="Port to listen on."),
    token: str = typer.Option(None, envvar="KRABLET_TOKEN", help="Bearer token clients must send."),
    fire_and_forget: bool = typer.Option(False, help="Commit with synchronous_commit=off."),
    writers_per_shard: int = typer.Option(8, help="Connections per shard (disjoint key slices)."),
) -> None:
    """Serve the write funnel over HTTP (client: krea2.krablet.FunnelClient).

    Example: krea2 krablet funnel --port 7431
    """
    from krea2.krablet.service import check_bind, make_funnel_app

    check_bind(host, token)
    wh = _warehouse(cluster)
    typer.echo(f"funnel for {len(wh.cluster)} shard(s) on http://{host}:{port}")
    app_ = make_funnel_app(
        wh, durable=not fire_and_forget, token=token, writers_per_shard=writers_per_shard
    )
    _serve(app_, host, port)


@app.command()
def rpc(
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind (a non-loopback one needs --token)."
    ),
    port: int = typer.Option(7432, help="Port to listen on."),
    token: str = typer.Option(None, envvar="KRABLET_TOKEN", help="Bearer token clients must send."),
) -> None:
    """Serve reads (get, scan, count, aggregate) over HTTP (client: krea2.krablet.RpcClient).

    Example: krea2 krablet rpc --port 7432
    """
    from krea2.krablet.service import check_bind, make_rpc_app

    check_bind(host, token)
    wh = _warehouse(cluster)
    typer.echo(f"rpc for {len(wh.cluster)} shard(s) on http://{host}:{port}")
    _serve(make_rpc_app(wh, token=token), host, port)
