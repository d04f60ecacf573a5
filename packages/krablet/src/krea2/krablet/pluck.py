"""pluck: map a Python function over a table's rows from a notebook, on any number of workers.

``PluckTable("images", key="image_key", where="embedding_path IS NULL", cluster=wh).map(fn)``
splits each shard's keyspace into ranges (boundaries from a TABLESAMPLE of the keys) and
returns a :class:`Handle`. A map is ordinary krablet data: one row of ``krablet_pluck_maps``
(the pickled function and its signature) and one row of ``krablet_pluck_ranges`` per range,
on the shard whose keys the range covers. Each range is a row of the ranges table's ``run``
job, so ranges are claimed, heartbeated, retried with jittered backoff and released by the
same :class:`~krea2.krablet.queue.Queue` and :class:`~krea2.krablet.worker.Worker` as any job.
Workers started with ``krea2 krablet worker --pluck`` (a :class:`PluckWorker`) run
``fn(rows) -> [dict | None, …]`` over the rows of a range that match ``where`` and write the
returned columns back to those rows.

SECURITY: a pluck map is Python code (cloudpickle) sent through the database, and whoever can
run it on a worker can do anything that worker can. Maps are therefore signed with HMAC-SHA256
using the cluster's secret (in the cluster file), and workers refuse any map whose signature
does not verify. Anyone holding the cluster file can run code on every pluck worker: protect it
like a private key, and never start pluck workers against a cluster whose secret you don't control.
"""

from __future__ import annotations

import itertools
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from krea2.infra.errors import UserError
from krea2.krablet.cluster import default_cluster_source
from krea2.krablet.schema import Job, Table, check_ident
from krea2.krablet.signing import sign, usable_secret
from krea2.krablet.sql import pluck as pluck_sql
from krea2.krablet.sql import reads
from krea2.krablet.sql.arrays import column_params
from krea2.krablet.sql.writes import upsert_rows, written_columns
from krea2.krablet.warehouse import Warehouse

MAPS = Table(
    "krablet_pluck_maps",
    key="map_id",
    columns={
        "table_name": "text",
        "where_sql": "text",
        "batch_size": "integer",
        "fn": "bytea",
        "signature": "text",
    },
    internal=True,
)
RUN = Job("run", result="rows_done", where="NOT cancelled", inputs=["map_id", "shard", "lo", "hi"])
RANGES = Table(
    "krablet_pluck_ranges",
    key="range_id",
    columns={
        "map_id": "text",
        "task": "integer",
        "shard": "integer",
        "lo": "text",
        "hi": "text",
        "cancelled": "boolean",
        "rows_done": "bigint",
    },
    jobs=[RUN],
    indexes=["map_id"],
    internal=True,
)
MAP_COLUMNS = ("table_name", "where_sql", "batch_size", "fn", "signature")


def map_signature(
    secret: str, map_id: str, table: str, where: str | None, batch: int, fn: bytes
) -> str:
    return sign(secret, map_id, table, where or "", str(batch), fn)


def require_secret(wh: Warehouse) -> str:
    """The cluster secret, refusing one too short to sign code with."""
    secret = wh.cluster.secret or ""
    if not usable_secret(secret):
        raise UserError(
            "pluck needs the cluster's secret (at least 16 characters) to sign and verify jobs: "
            "use the cluster file written by `krea2 krablet up`, or set KRABLET_SECRET"
        )
    return secret


def _dumps(fn: Any) -> bytes:
    """Pickle ``fn`` by value (its module need not be importable on the workers)."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    registered = False
    if module is not None and module.__name__ not in ("__main__", "builtins"):
        try:
            cloudpickle.register_pickle_by_value(module)
            registered = True
        except ValueError:
            pass
    try:
        return cloudpickle.dumps(fn)
    finally:
        if registered:
            cloudpickle.unregister_pickle_by_value(module)


def _write(conn: psycopg.Connection, t: Table, rows: list[tuple], columns: tuple[str, ...]) -> None:
    """Upsert ``rows`` (key first, then ``columns``) into ``t`` on this connection's shard."""
    conn.execute(upsert_rows(t, columns), column_params(written_columns(t, columns), rows))


class PluckTable:
    """A table (optionally filtered by ``where``, SQL over its columns) to map functions over."""

    def __init__(
        self,
        name: str,
        key: str | None = None,
        where: str | None = None,
        cluster: Warehouse | Any = None,
    ) -> None:
        if cluster is None:
            cluster = default_cluster_source(None)
        self.wh = cluster if isinstance(cluster, Warehouse) else Warehouse.open(cluster)
        self.table = self.wh.table(check_ident(name, "table"))
        if key is not None and key != self.table.key:
            raise UserError(f"table {name!r} has key {self.table.key!r}, not {key!r}")
        self.where = where

    def _ranges(
        self, conn: psycopg.Connection, target_rows: int
    ) -> list[tuple[str | None, str | None]]:
        """(lo, hi] key ranges of about ``target_rows`` rows each covering this shard's keys."""
        name = self.table.name
        est = conn.execute(reads.row_estimate(), (f'"{name}"',)).fetchone()[0]
        if est < 0:
            conn.execute(reads.analyze_table(name))
            est = conn.execute(reads.row_estimate(), (f'"{name}"',)).fetchone()[0]
        n_tasks = max(1, min(1000, int(est // max(target_rows, 1))))
        if n_tasks == 1:
            return [(None, None)]
        if est <= 200_000:  # small: exact boundaries are cheap
            sample = [r[0] for r in conn.execute(reads.all_keys(self.table))]
        else:  # large: ~20 sampled keys per range from a page sample (TABLESAMPLE SYSTEM)
            pct = min(100.0, 100.0 * 20 * n_tasks / est)
            sample = sorted(
                r[0] for r in conn.execute(reads.sample_keys(self.table, "SYSTEM"), (pct,))
            )
            if len(sample) < n_tasks:
                sample = sorted(
                    r[0] for r in conn.execute(reads.sample_keys(self.table, "BERNOULLI"), (pct,))
                )
        step = max(1, len(sample) // n_tasks)
        bounds = sorted(set(sample[step::step]))
        edges: list[str | None] = [None, *(str(b) for b in bounds), None]
        return list(itertools.pairwise(edges))

    def map(
        self, fn: Callable | type, batch_size: int = 64, rows_per_task: int | None = None
    ) -> Handle:
        """Queue ``fn`` over the table; returns a :class:`Handle`. ``fn`` may be a class with
        ``setup()`` and ``__call__(rows)``, instantiated once per worker. A range holds about
        ``rows_per_task`` rows (default ``16 * batch_size``); ``fn`` sees ``batch_size`` at once."""
        secret = require_secret(self.wh)
        self.wh.migrate([MAPS, RANGES])
        map_id = f"p{int(time.time())}-{secrets.token_hex(4)}"
        blob = _dumps(fn)
        signature = map_signature(secret, map_id, self.table.name, self.where, batch_size, blob)
        target = rows_per_task or batch_size * 16
        for i in range(len(self.wh.cluster)):
            with self.wh.cluster.connection(i) as conn, conn.transaction():
                _write(
                    conn,
                    MAPS,
                    [(map_id, self.table.name, self.where, batch_size, blob, signature)],
                    MAP_COLUMNS,
                )
                ranges = [
                    (f"{map_id}:{i}:{n}", map_id, n, i, lo, hi, False)
                    for n, (lo, hi) in enumerate(self._ranges(conn, target))
                ]
                _write(conn, RANGES, ranges, ("map_id", "task", "shard", "lo", "hi", "cancelled"))
        return Handle(self.wh, map_id)


@dataclass
class Progress:
    """A map's ranges (``tasks``), ranges done, rows seen, ranges failing, and its status."""

    tasks: int
    done: int
    rows: int
    failing: int
    status: str

    @property
    def finished(self) -> bool:
        return self.tasks > 0 and self.done == self.tasks


class Handle:
    """A submitted pluck map: watch it from any process with ``Handle(wh, map_id)``."""

    def __init__(self, wh: Warehouse, map_id: str) -> None:
        self.wh, self.map_id = wh, map_id

    def __repr__(self) -> str:
        return f"pluck.Handle({self.map_id!r})"

    def _each(self, query: sql.Composable) -> list[list[dict]]:
        """``query`` (of ``map_id``) on every shard: one list of rows per shard."""
        out = []
        for i in range(len(self.wh.cluster)):
            with self.wh.cluster.connection(i) as conn, conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query, (self.map_id,))
                out.append(cur.fetchall() if cur.description else [])
        return out

    def progress(self) -> Progress:
        rows = [p[0] for p in self._each(pluck_sql.map_progress(RANGES, RUN))]
        if not any(r["tasks"] for r in rows):
            raise UserError(f"no pluck job {self.map_id!r} on this cluster")
        return Progress(
            sum(r["tasks"] for r in rows),
            sum(r["done"] for r in rows),
            int(sum(r["rows"] for r in rows)),
            sum(r["failing"] for r in rows),
            "cancelled" if any(r["cancelled"] for r in rows) else "running",
        )

    def errors(self) -> list[dict[str, Any]]:
        """Ranges whose last attempt failed: shard, task, attempts, last error."""
        parts = self._each(pluck_sql.map_errors(RANGES, RUN))
        return [{"shard": i, **r} for i, p in enumerate(parts) for r in p]

    def cancel(self) -> None:
        """Stop the map: workers claim none of its ranges from now on."""
        self._each(pluck_sql.cancel_map(RANGES))

    def wait(self, timeout: float | None = None, poll_s: float = 0.2) -> Progress:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            p = self.progress()
            if p.finished or p.status == "cancelled":
                return p
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pluck job {self.map_id} not done after {timeout}s: {p}")
            time.sleep(poll_s)

    def attach(
        self, console: Any = None, poll_s: float = 0.5, timeout: float | None = None
    ) -> Progress:
        """Show live progress (rich) until the map finishes or is cancelled."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
        from rich.progress import Progress as Bar

        console = console or Console()
        deadline = None if timeout is None else time.monotonic() + timeout
        with Bar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rows]} rows, {task.fields[failing]} failing"),
            console=console,
            transient=False,
        ) as bar:
            p = self.progress()
            task = bar.add_task(
                f"pluck {self.map_id}", total=p.tasks, rows=p.rows, failing=p.failing
            )
            while True:
                p = self.progress()
                bar.update(task, completed=p.done, total=p.tasks, rows=p.rows, failing=p.failing)
                if p.finished or p.status == "cancelled":
                    return p
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"pluck job {self.map_id} not done after {timeout}s")
                time.sleep(poll_s)


__all__ = ["Handle", "PluckTable", "Progress", "map_signature", "require_secret"]
