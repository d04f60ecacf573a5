"""`krea2 krablet worker` and `retry`: run a job over its rows, run chosen rows again, and
what the end of a run means (the exit status)."""

from __future__ import annotations

from collections.abc import Callable

import typer

from krea2.infra.errors import UserError


class RowsFailed(UserError):
    """An ``--until-empty`` run ended with rows of the job failed and backing off (exit 4)."""

    exit_code = 4


CLUSTER_HELP = (
    "Cluster file written by `up`, or DSNs separated by commas (default: $KRABLET_CLUSTER)."
)


def open_warehouse(cluster: str | None):
    """The warehouse named by ``--cluster`` (or ``$KRABLET_CLUSTER``), tables from its catalog."""
    from krea2.krablet.cluster import default_cluster_source
    from krea2.krablet.warehouse import Warehouse

    return Warehouse.open(default_cluster_source(cluster))


def retry(
    job: str = typer.Argument(..., help="TABLE.JOB, e.g. images.ocr."),
    where: str = typer.Option(
        None, help="SQL condition on the table's columns choosing the rows, e.g. \"key = 'k7'\"."
    ),
    all_rows: bool = typer.Option(
        False, "--all", help="Every unleased row of the job (done rows after confirmation)."
    ),
    yes: bool = typer.Option(
        False, "--yes", help="Run chosen done rows again without asking (for scripts)."
    ),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Run a job again on chosen rows: failed or waiting rows are ready now with attempts back
    to 0; rows the job already did have their results cleared and run again once you confirm
    (or pass --yes), since those results are lost. Without a terminal to ask and without
    --yes, done rows are left as they are.

    Example: krea2 krablet retry images.ocr --where "key = 'k007'"
    """
    import sys

    from krea2.krablet.connections import ShardsUnreachable

    if not where and not all_rows:
        raise UserError('choose the rows: --where "SQL condition" (or --all for every row)')
    wh = open_warehouse(cluster)
    table, _, name = job_name(job)
    q = wh.queue(table, name)
    up, down = [], []
    for i in range(len(wh.cluster)):
        try:
            up.append((i, q.count_done(i, where)))
        except ShardsUnreachable as exc:
            down.append(str(exc))
    done = sum(n for _, n in up)
    if done and not yes:
        results = ", ".join(q.job.results)
        question = (
            f"{done} row(s) of {job} are done and match: clear their results ({results}) "
            "and run them again?"
        )
        if not sys.stdin.isatty():  # no one to ask: the question's default, no
            typer.echo(f"{question} Left as they are: pass --yes to do so", err=True)
            done = 0
        elif not typer.confirm(question, default=False):
            typer.echo("done rows left as they are")
            done = 0
    total = 0
    for i, _ in up:
        try:
            ready = len(q.retry(i, where))
            again = len(q.redo(i, where)) if done else 0
        except ShardsUnreachable as exc:
            down.append(str(exc))
            continue
        total += ready + again
        typer.echo(
            f"{wh.cluster.describe(i)}: {ready} failed or waiting row(s) ready again, "
            f"{again} done row(s) cleared and queued"
        )
    wh.close()
    typer.echo(f"{total} row(s) of {job} ready again, attempts reset")
    if down:
        raise ShardsUnreachable("; ".join(down))


def job_name(job: str | None) -> tuple[str, str, str]:
    if not job or "." not in job:
        raise UserError("--job must be TABLE.JOB, e.g. --job images.ocr (or pass --pluck)")
    return job.partition(".")


def worker(
    job: str = typer.Option(None, help="TABLE.JOB to run, e.g. images.ocr."),
    handler: str = typer.Option(
        None,
        help="module:function (or file.py:function); default: the job's declared handler, "
        "imported only if the catalog entry is signed with the cluster's secret.",
    ),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
    batch_size: int = typer.Option(32, help="Rows per claim."),
    concurrency: int = typer.Option(1, help="Batches processed at once (threads)."),
    lease_s: float = typer.Option(
        None,
        help="Lease length in seconds (default: the job's). A killed worker's rows are retried "
        "once it expires, behind the rows already ready.",
    ),
    until_empty: bool = typer.Option(False, help="Exit once no shard has ready or leased rows."),
    give_up_s: float = typer.Option(
        30.0, help="With --until-empty: how long an unreachable shard is waited for."
    ),
    pluck: bool = typer.Option(False, "--pluck", help="Run signed pluck jobs instead of --job."),
    metrics_port: int = typer.Option(None, help="Serve /metrics on this port (loopback)."),
) -> None:
    """Run a job's handler over the cluster; SIGTERM finishes or releases claims and exits.

    Exit status: 0 when the job's work is finished; 130 (SIGINT) or 143 (SIGTERM) whenever a
    signal stopped it; 3 when shards were unreachable (named on stderr); 4 when rows of the
    job failed and are backing off (`krablet status` lists them, `krablet retry` re-queues).

    Example: krea2 krablet worker --job images.ocr --handler mypkg.ocr:run --batch-size 64
    """
    from krea2.krablet.worker import Worker, resolve_handler

    signals = SignalLatch()  # from here on, SIGTERM/SIGINT is the run's outcome
    wh = open_warehouse(cluster)
    if metrics_port is not None:
        from krea2.infra.metrics import start_exporter

        start_exporter(port=metrics_port)
    if pluck:
        from krea2.krablet.pluck_worker import PluckWorker

        w = PluckWorker(wh, concurrency=concurrency, lease_s=lease_s)
        w.give_up_s = give_up_s
        signals.forward_to(w.stop)
        stats = w.run(until_empty=until_empty)
        typer.echo(
            f"pluck worker {w.owner} done: {stats.completed} ranges completed, {stats.failed} "
            f"failed ({w.runner.refused} refused), {stats.released} released"
        )
        job = None  # a failing map is reported by its handle, not by the workers' exit status
    else:
        table, _, name = job_name(job)
        spec = handler or wh.declared_handler(table, name)
        w = Worker(
            wh,
            table,
            name,
            resolve_handler(spec),
            batch_size=batch_size,
            concurrency=concurrency,
            lease_s=lease_s,
            give_up_s=give_up_s,
        )
        signals.forward_to(w.stop)
        stats = w.run(until_empty=until_empty)
        typer.echo(
            f"worker {w.owner} done: {stats.completed} completed, {stats.failed} failed, "
            f"{stats.released} released, {stats.lost} lost leases"
        )
    wh.close()
    exit_status(stats, job)


class SignalLatch:
    """SIGTERM/SIGINT handlers installed before the worker exists: the first signal is kept
    and handed to the worker's ``stop`` once it is known, so a signal at any moment of the
    command (start-up included) ends it with 128 + the signal."""

    def __init__(self) -> None:
        import signal

        self.first: int | None = None
        self._stop: Callable[[int], None] | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._caught)

    def _caught(self, signum: int, _frame: object) -> None:
        if self.first is None:
            self.first = signum
        if self._stop is not None:
            self._stop(signum)

    def forward_to(self, stop: Callable[[int], None]) -> None:
        """Call ``stop(signum)`` on every signal from now on, and now for one already caught."""
        self._stop = stop
        if self.first is not None:
            stop(self.first)


def exit_status(stats, job: str | None) -> None:
    """A signal: 128 + its number; unreachable shards: 3; failed rows of ``job``: 4; else 0."""
    import signal

    from krea2.krablet.connections import ShardsUnreachable

    if stats.stopped_by is not None or stats.interrupted:
        raise typer.Exit(128 + int(stats.stopped_by or signal.SIGINT))
    if stats.unreachable_shards:
        raise ShardsUnreachable(
            f"{', '.join(stats.unreachable)} unreachable: its rows were not worked on; the "
            "reachable shards' work is done. Run the worker again once it is back "
            "(krea2 krablet status shows it)"
        )
    if job is not None and stats.failing:
        raise RowsFailed(
            f"{stats.failing} row(s) of {job} failed and are backing off: `krea2 krablet "
            f"status` shows their errors; fix the cause, then `krea2 krablet retry {job} --all` "
            "runs them again now"
        )
