"""``krea2 krablet``: start shards, show status, run workers, the funnel and the RPC server."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC
from pathlib import Path

import typer

from krea2.infra.errors import UserError
from krea2.krablet.cli_jobs import CLUSTER_HELP, retry, worker
from krea2.krablet.cli_jobs import open_warehouse as _warehouse

app = typer.Typer(
    help="The sharded PostgreSQL warehouse.\n\nExample: krea2 krablet up --shards 2 --data /tmp/kb",
    no_args_is_help=True,
)


@app.command()
def up(
    shards: int = typer.Option(
        None, help="Number of embedded shards (default: the existing cluster's, else 2)."
    ),
    data: Path = typer.Option(..., help="Directory for the shards' data (one sub-directory each)."),
    cluster_file: Path = typer.Option(
        None, "--cluster-file", help="Where to write the cluster file (default: DATA/cluster.json)."
    ),
    shard: int = typer.Option(None, "--shard", help="Start only this shard (0-based)."),
) -> None:
    """Start N embedded PostgreSQL 16 shards (pgserver) and write a cluster file.

    Running it again reuses the data and restarts stopped shards; the secret is kept.
    `--shard N` restarts one shard of an existing cluster (after `down --shard N`).

    Example: krea2 krablet up --shards 2 --data /tmp/kb
    (then: export KRABLET_CLUSTER=/tmp/kb/cluster.json)
    """
    from krea2.krablet.cluster import Cluster, load_cluster
    from krea2.krablet.embedded import up as start

    path = cluster_file or data / "cluster.json"
    old = load_cluster(path) if path.exists() else None
    known = old.embedded.get("shards") if old is not None and old.embedded else None
    if shards is not None and known is not None and known != shards:
        raise UserError(
            f"{path} describes {known} shards, not {shards}: rows are placed "
            "by shard count, so it cannot change; use another --data directory"
        )
    if shard is not None and old is None:
        raise UserError(f"--shard needs an existing cluster: {path} does not exist yet")
    n = shards or known or (len(old.shards) if old is not None else 2)
    started = start(n, data, shard=shard)
    dsns = [started.get(i) or old.shards[i] for i in range(n)] if old else list(started.values())
    cluster = Cluster(
        dsns,
        secret=old.secret if old else Cluster(dsns).secret,
        embedded={"data": str(data.resolve()), "shards": n},
        connect_timeout_s=old.connect_timeout_s if old else Cluster(dsns).connect_timeout_s,
    )
    cluster.save(path)
    which = f"shard {shard}" if shard is not None else f"{n} shard(s)"
    typer.echo(f"{which} running under {data}; cluster file: {path}")
    typer.echo(f"next: export KRABLET_CLUSTER={path}; krea2 krablet status")


@app.command()
def down(
    data: Path = typer.Option(..., help="The --data directory given to `up`."),
    shard: int = typer.Option(None, "--shard", help="Stop only this shard (0-based)."),
) -> None:
    """Stop the embedded shards under DATA, or one of them (the data is kept).

    Example: krea2 krablet down --data /tmp/kb
    """
    from krea2.krablet.embedded import down as stop

    stopped = stop(data, shard=shard)
    if shard is None:
        typer.echo(f"stopped {stopped} shard(s)")
    else:
        typer.echo(f"stopped shard {shard}" if stopped else f"shard {shard} was not running")


def _age(ts) -> str:
    from datetime import datetime

    if ts is None:
        return "?"
    seconds = (ts - datetime.now(UTC)).total_seconds()
    return f"in {seconds:.0f}s" if seconds > 0 else "now"


@app.command()
def status(
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    errors: int = typer.Option(5, help="Failed rows to show per job and shard."),
) -> None:
    """Shards, tables, row counts, queue backlogs, and each job's failing rows (attempts, last
    error). Exits 3 when a shard is unreachable.

    Example: krea2 krablet status --cluster /tmp/kb/cluster.json
    """
    from krea2.krablet.cluster import default_cluster_source, load_cluster
    from krea2.krablet.connections import ShardsUnreachable
    from krea2.krablet.warehouse import Warehouse

    wh = Warehouse(load_cluster(default_cluster_source(cluster)))
    with contextlib.suppress(ShardsUnreachable):  # shown shard by shard below
        wh.reload()
    st = wh.status(errors=errors)
    wh.close()
    if as_json:
        typer.echo(json.dumps(st, indent=2, default=str))
    else:
        _print_status(wh, st)
    if st["unreachable"]:
        raise typer.Exit(3)


def _print_status(wh, st: dict) -> None:
    for i, entry in enumerate(st["shards"]):
        name = wh.cluster.describe(i)
        if not entry["ok"]:
            typer.echo(f"{name}  DOWN: {entry['error']}")
            continue
        typer.echo(f"{name}  up")
        for table, t in entry["tables"].items():
            typer.echo(f"  {table}: {t['rows']} rows")
            for job, q in t["jobs"].items():
                typer.echo(
                    f"    job {job}: ready {q['ready']}, leased {q['leased']}, backing off "
                    f"{q['backing_off']}, failing {q['failing']}, "
                    f"oldest ready {q['oldest_ready_s']:.1f}s"
                )
                for e in q["errors"]:
                    typer.echo(
                        f"      {e['key']}: {e['attempts']} attempt(s), next try "
                        f"{_age(e['next_try_at'])}: {e['last_error']}"
                    )
    if not wh.tables:
        typer.echo("no tables declared yet" if not st["unreachable"] else "tables: unknown")
    for job, failing in st["failing"].items():
        typer.echo(f"failing rows of {job}: {failing} in total")
    down = ", ".join(str(i) for i in st["unreachable"])
    if st["schema_consistent"] is None:
        typer.echo("schema: not checked (no shard reachable)")
    elif not st["schema_consistent"]:
        typer.echo("schema: DIFFERS between shards (run the migration again)")
    elif down:
        typer.echo(f"schema: identical on the reachable shards; not checked on shard(s) {down}")
    else:
        typer.echo("schema: identical on all shards")


app.command()(retry)
app.command()(worker)


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


@app.command()
def exporter(
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
    port: int = typer.Option(9300, help="Port of the /metrics endpoint."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; 0.0.0.0 inside a pod."),
    interval: float = typer.Option(15.0, help="Seconds between two reads of the shards."),
    cap: int = typer.Option(100_000, help="Backlog counts stop at this many rows per shard."),
    once: bool = typer.Option(False, "--once", help="Read once, print the backlogs, exit."),
) -> None:
    """Serve every job's backlog, leases and shard health on /metrics, read every INTERVAL
    seconds: the signal that autoscales workers (krea2 infra workers renders the HPA/KEDA).

    Example: krea2 krablet exporter --port 9300 --host 0.0.0.0
    """
    import time

    from krea2.infra.metrics import start_exporter
    from krea2.krablet.metrics import refresh

    wh = _warehouse(cluster)
    if once:
        st = refresh(wh, cap=cap)
        wh.close()
        for entry in st["shards"]:
            for table, t in entry.get("tables", {}).items():
                for job, q in t["jobs"].items():
                    typer.echo(
                        f"shard {entry['shard']} {table}.{job}: backlog {q['ready']}, "
                        f"leased {q['leased']}, backing off {q['backing_off']}"
                    )
        if st["unreachable"]:
            raise typer.Exit(3)
        return
    server = start_exporter(port=port, host=host)
    typer.echo(f"krablet metrics every {interval:g} s on http://{host}:{server.port}/metrics")
    try:
        while True:
            try:
                refresh(wh, cap=cap)
            except Exception as exc:  # a shard outage must not stop the other shards' numbers
                typer.echo(f"backlog read failed: {type(exc).__name__}: {exc}", err=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        wh.close()
