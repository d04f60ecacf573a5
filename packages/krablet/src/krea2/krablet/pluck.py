"""pluck: map a Python function over a table's rows from a notebook, on any number of workers.

``pluck.Table("images", key="image_key", where="embedding_path IS NULL", cluster=wh).map(fn)``
splits each shard's keyspace into ranges (boundaries from a TABLESAMPLE of the keys), stores
them as a task queue on that shard and returns a :class:`Handle`. Workers started with
``krea2 krablet worker --pluck`` claim ranges with the same lease semantics as jobs, run
``fn(rows) -> [dict | None, …]`` over the rows of the range that match ``where`` and write the
returned columns back to those rows.

SECURITY: a pluck job is Python code (cloudpickle) sent through the database, and whoever can
run it on a worker can do anything that worker can. Jobs are therefore signed with HMAC-SHA256
using the cluster's secret (in the cluster file), and workers refuse any job whose signature
does not verify. Anyone holding the cluster file can run code on every pluck worker: protect it
like a private key, and never start pluck workers against a cluster whose secret you don't control.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from krea2.infra.errors import UserError
from krea2.krablet.batch_sql import column_params
from krea2.krablet.funnel import write_statement
from krea2.krablet.schema import check_ident
from krea2.krablet.warehouse import Warehouse
from krea2.krablet.worker import RETRYABLE

PLUCK_DDL = [
    """CREATE TABLE IF NOT EXISTS krablet_pluck_jobs (
        id text PRIMARY KEY, table_name text NOT NULL, where_sql text, batch_size integer NOT NULL,
        fn bytea NOT NULL, signature text NOT NULL, status text NOT NULL DEFAULT 'running',
        lease_s real NOT NULL DEFAULT 60, created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS krablet_pluck_tasks (
        job_id text NOT NULL REFERENCES krablet_pluck_jobs (id) ON DELETE CASCADE,
        task integer NOT NULL, lo text, hi text,
        next_try_at timestamptz NOT NULL DEFAULT now(), attempts integer NOT NULL DEFAULT 0,
        owner text, token bigint, last_error text, done boolean NOT NULL DEFAULT false,
        rows_done bigint NOT NULL DEFAULT 0, PRIMARY KEY (job_id, task))
        WITH (fillfactor = 70)""",
    "CREATE INDEX IF NOT EXISTS krablet_pluck_tasks_ready ON krablet_pluck_tasks (next_try_at) "
    "WHERE NOT done",
]

CLAIM_TASK = """
WITH c AS MATERIALIZED (
    SELECT t.job_id, t.task FROM krablet_pluck_tasks t JOIN krablet_pluck_jobs j ON j.id = t.job_id
    WHERE NOT t.done AND t.next_try_at <= now() AND j.status = 'running'
    ORDER BY t.next_try_at LIMIT 1 FOR UPDATE OF t SKIP LOCKED
)
UPDATE krablet_pluck_tasks t SET next_try_at = now() + make_interval(secs => j.lease_s),
    attempts = t.attempts + 1, owner = %(owner)s, token = %(token)s
FROM c, krablet_pluck_jobs j
WHERE t.job_id = c.job_id AND t.task = c.task AND j.id = c.job_id
RETURNING t.job_id, t.task, t.lo, t.hi, j.table_name, j.where_sql, j.batch_size, j.fn, j.signature,
    j.lease_s"""


def sign(secret: str, *parts: bytes | str) -> str:
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        mac.update(len(b).to_bytes(8, "big"))
        mac.update(b)
    return mac.hexdigest()


def _job_signature(
    secret: str, job_id: str, table: str, where: str | None, batch: int, fn: bytes
) -> str:
    return sign(secret, job_id, table, where or "", str(batch), fn)


def require_secret(wh: Warehouse) -> str:
    """The cluster secret, refusing one too short to sign code with."""
    secret = wh.cluster.secret or ""
    if len(secret) < 16:
        raise UserError(
            "pluck needs the cluster's secret (at least 16 characters) to sign and verify jobs: "
            "use the cluster file written by `krea2 krablet up`, or set KRABLET_SECRET"
        )
    return secret


def ensure_schema(wh: Warehouse) -> None:
    for i in range(len(wh.cluster)):
        with wh.cluster.pool(i).connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(7150001)")
            for stmt in PLUCK_DDL:
                conn.execute(stmt)


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


class Table:
    """A table (optionally filtered by ``where``, SQL over its columns) to map functions over."""

    def __init__(
        self,
        name: str,
        key: str | None = None,
        where: str | None = None,
        cluster: Warehouse | Any = None,
    ) -> None:
        if cluster is None:
            from krea2.krablet.cluster import default_cluster_source

            cluster = default_cluster_source(None)
        self.wh = cluster if isinstance(cluster, Warehouse) else Warehouse.open(cluster)
        self.table = self.wh.table(check_ident(name, "table"))
        if key is not None and key != self.table.key:
            raise UserError(f"table {name!r} has key {self.table.key!r}, not {key!r}")
        self.where = where

    def _ranges(
        self, conn: psycopg.Connection, target_rows: int
    ) -> list[tuple[str | None, str | None]]:
        t = sql.Identifier(self.table.name)
        k = sql.Identifier(self.table.key)
        est = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (f'"{self.table.name}"',)
        ).fetchone()[0]
        if est < 0:
            conn.execute(sql.SQL("ANALYZE {}").format(t))
            est = conn.execute(
                "SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (f'"{self.table.name}"',)
            ).fetchone()[0]
        n_tasks = max(1, min(1000, int(est // max(target_rows, 1))))
        if n_tasks == 1:
            return [(None, None)]
        if est <= 200_000:  # small: exact boundaries are cheap
            sample = [
                r[0]
                for r in conn.execute(sql.SQL("SELECT {k} FROM {t} ORDER BY {k}").format(k=k, t=t))
            ]
        else:  # large: ~20 sampled keys per range from a page sample (TABLESAMPLE SYSTEM)
            pct = min(100.0, 100.0 * 20 * n_tasks / est)
            sample = sorted(
                r[0]
                for r in conn.execute(
                    sql.SQL("SELECT {k} FROM {t} TABLESAMPLE SYSTEM (%s)").format(k=k, t=t), (pct,)
                )
            )
            if len(sample) < n_tasks:
                sample = sorted(
                    r[0]
                    for r in conn.execute(
                        sql.SQL("SELECT {k} FROM {t} TABLESAMPLE BERNOULLI (%s)").format(k=k, t=t),
                        (pct,),
                    )
                )
        step = max(1, len(sample) // n_tasks)
        bounds = sorted(set(sample[step::step]))
        edges: list[str | None] = [None, *(str(b) for b in bounds), None]
        return list(itertools.pairwise(edges))

    def map(
        self,
        fn: Callable | type,
        batch_size: int = 64,
        rows_per_task: int | None = None,
        lease_s: float = 60.0,
    ) -> Handle:
        """Queue ``fn`` over the table; returns a :class:`Handle`. ``fn`` may be a class with
        ``setup()`` and ``__call__(rows)``, instantiated once per worker."""
        require_secret(self.wh)
        ensure_schema(self.wh)
        job_id = f"p{int(time.time())}-{secrets.token_hex(4)}"
        blob = _dumps(fn)
        signature = _job_signature(
            self.wh.cluster.secret, job_id, self.table.name, self.where, batch_size, blob
        )
        target = rows_per_task or batch_size * 16
        for i in range(len(self.wh.cluster)):
            with self.wh.cluster.pool(i).connection() as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO krablet_pluck_jobs (id, table_name, where_sql, batch_size, fn, "
                    "signature, lease_s) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (job_id, self.table.name, self.where, batch_size, blob, signature, lease_s),
                )
                ranges = self._ranges(conn, target)
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO krablet_pluck_tasks (job_id, task, lo, hi)"
                        " VALUES (%s, %s, %s, %s)",
                        [(job_id, n, lo, hi) for n, (lo, hi) in enumerate(ranges)],
                    )
        return Handle(self.wh, job_id)


@dataclass
class Progress:
    tasks: int
    done: int
    rows: int
    failing: int
    status: str

    @property
    def finished(self) -> bool:
        return self.tasks > 0 and self.done == self.tasks


class Handle:
    """A submitted pluck job: watch it from any process with ``Handle(wh, job_id)``."""

    def __init__(self, wh: Warehouse, job_id: str) -> None:
        self.wh, self.job_id = wh, job_id

    def __repr__(self) -> str:
        return f"pluck.Handle({self.job_id!r})"

    def _each(self, query: str, params: tuple = ()) -> list[list[dict]]:
        out = []
        for i in range(len(self.wh.cluster)):
            with (
                self.wh.cluster.pool(i).connection() as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                cur.execute(query, (self.job_id, *params))
                out.append(cur.fetchall())
        return out

    def progress(self) -> Progress:
        parts = self._each(
            "SELECT count(*) AS tasks, count(*) FILTER (WHERE t.done) AS done, "
            "coalesce(sum(t.rows_done), 0) AS rows, "
            "count(*) FILTER (WHERE NOT t.done AND t.last_error IS NOT NULL) AS failing, "
            "min(j.status) AS status FROM krablet_pluck_jobs j "
            "LEFT JOIN krablet_pluck_tasks t ON t.job_id = j.id WHERE j.id = %s GROUP BY j.id"
        )
        rows = [p[0] for p in parts if p]
        if not rows:
            raise UserError(f"no pluck job {self.job_id!r} on this cluster")
        status = "cancelled" if any(r["status"] == "cancelled" for r in rows) else "running"
        return Progress(
            sum(r["tasks"] for r in rows),
            sum(r["done"] for r in rows),
            int(sum(r["rows"] for r in rows)),
            sum(r["failing"] for r in rows),
            status,
        )

    def errors(self) -> list[dict[str, Any]]:
        """Ranges whose last attempt failed: shard, task, attempts, last error."""
        parts = self._each(
            "SELECT task, attempts, last_error FROM krablet_pluck_tasks "
            "WHERE job_id = %s AND last_error IS NOT NULL AND NOT done ORDER BY task"
        )
        return [{"shard": i, **r} for i, p in enumerate(parts) for r in p]

    def cancel(self) -> None:
        """Stop the job: workers claim none of its ranges from now on."""
        self._each("UPDATE krablet_pluck_jobs SET status = 'cancelled' WHERE id = %s RETURNING id")

    def wait(self, timeout: float | None = None, poll_s: float = 0.2) -> Progress:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            p = self.progress()
            if p.finished or p.status == "cancelled":
                return p
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pluck job {self.job_id} not done after {timeout}s: {p}")
            time.sleep(poll_s)

    def attach(
        self, console: Any = None, poll_s: float = 0.5, timeout: float | None = None
    ) -> Progress:
        """Show live progress (rich) until the job finishes or is cancelled."""
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
                f"pluck {self.job_id}", total=p.tasks, rows=p.rows, failing=p.failing
            )
            while True:
                p = self.progress()
                bar.update(task, completed=p.done, total=p.tasks, rows=p.rows, failing=p.failing)
                if p.finished or p.status == "cancelled":
                    return p
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"pluck job {self.job_id} not done after {timeout}s")
                time.sleep(poll_s)


class PluckWorker:
    """Claims pluck ranges from every shard and runs their (verified) functions."""

    def __init__(self, wh: Warehouse, concurrency: int = 1, poll_s: float = 0.2) -> None:
        require_secret(wh)
        self.wh, self.concurrency, self.poll_s = wh, concurrency, poll_s
        self.owner = f"pluck-{secrets.token_hex(4)}"
        self._stop = threading.Event()
        self._fns: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.done = 0
        self.refused = 0

    def stop(self) -> None:
        self._stop.set()

    def run(self, until_empty: bool = False, install_signals: bool = False) -> dict[str, int]:
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        ensure_schema(self.wh)
        threads = [
            threading.Thread(target=self._loop, args=(until_empty,), daemon=True)
            for _ in range(self.concurrency)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"tasks_done": self.done, "refused": self.refused}

    def _loop(self, until_empty: bool) -> None:
        n = len(self.wh.cluster)
        empty = 0
        while not self._stop.is_set():
            shard = secrets.randbelow(n)
            try:
                ran = self._one(shard)
            except RETRYABLE:
                ran = False
            if ran:
                empty = 0
                continue
            empty += 1
            if until_empty and empty >= 3 * n and not self._any_ready():
                return
            self._stop.wait(self.poll_s)

    def _any_ready(self) -> bool:
        for i in range(len(self.wh.cluster)):
            with self.wh.cluster.pool(i).connection() as conn:
                if conn.execute(
                    "SELECT 1 FROM krablet_pluck_tasks t JOIN krablet_pluck_jobs j ON "
                    "j.id = t.job_id WHERE NOT t.done AND j.status = 'running' AND "
                    "(t.next_try_at <= now() OR t.token IS NOT NULL) LIMIT 1"
                ).fetchone():
                    return True
        return False

    def _one(self, shard: int) -> bool:
        token = secrets.randbits(62)
        with (
            self.wh.cluster.pool(shard).connection() as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            cur.execute(CLAIM_TASK, {"owner": self.owner, "token": token})
            task = cur.fetchone()
        if task is None:
            return False
        fn_bytes = bytes(task["fn"])
        expected = _job_signature(
            self.wh.cluster.secret,
            task["job_id"],
            task["table_name"],
            task["where_sql"],
            task["batch_size"],
            fn_bytes,
        )
        if not hmac.compare_digest(expected, task["signature"]):
            self.refused += 1
            self._finish(
                shard,
                task,
                token,
                error="refused: the job's signature does not match this "
                "cluster's secret (unsigned or forged pluck job); it was not run",
                backoff=3600,
            )
            return True
        stop_beat = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(shard, task, token, stop_beat), daemon=True
        )
        beat.start()
        try:
            rows = self._run_range(shard, task, self._callable(task["job_id"], fn_bytes))
        except Exception as exc:
            stop_beat.set()
            msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
            self._finish(shard, task, token, error=msg)
            return True
        stop_beat.set()
        self._finish(shard, task, token, rows=rows)
        return True

    def _callable(self, job_id: str, blob: bytes) -> Callable:
        with self._lock:
            fn = self._fns.get(job_id)
            if fn is None:
                fn = cloudpickle.loads(blob)
                if isinstance(fn, type):
                    fn = fn()
                    if hasattr(fn, "setup"):
                        fn.setup()
                self._fns[job_id] = fn
            return fn

    def _run_range(self, shard: int, task: dict, fn: Callable) -> int:
        t = self.wh.table(task["table_name"])
        k, kt = sql.Identifier(t.key), sql.SQL(t.key_type)
        cond = [sql.SQL("({})").format(sql.SQL(task["where_sql"]))] if task["where_sql"] else []
        if task["lo"] is not None:
            cond.append(sql.SQL("{} > %(lo)s::{}").format(k, kt))
        if task["hi"] is not None:
            cond.append(sql.SQL("{} <= %(hi)s::{}").format(k, kt))

        def page(first: bool) -> sql.Composable:
            extra = [] if first else [sql.SQL("{} > %(after)s::{}").format(k, kt)]
            where = sql.SQL(" AND ").join([*cond, *extra]) if cond or extra else sql.SQL("TRUE")
            return sql.SQL("SELECT * FROM {} WHERE {} ORDER BY {} LIMIT %(n)s").format(
                sql.Identifier(t.name), where, k
            )

        first_page, next_page = page(True), page(False)
        after, total = None, 0
        while not self._stop.is_set():
            with (
                self.wh.cluster.pool(shard).connection() as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                cur.execute(
                    first_page if after is None else next_page,
                    {"lo": task["lo"], "hi": task["hi"], "after": after, "n": task["batch_size"]},
                )
                rows = cur.fetchall()
            if not rows:
                break
            out = fn([dict(r) for r in rows])
            if out is not None:
                self._write(shard, t, rows, list(out))
            total += len(rows)
            after = str(rows[-1][t.key])
            if len(rows) < task["batch_size"]:
                break
        if self._stop.is_set():
            raise InterruptedError("worker stopping; the range will be retried")
        return total

    def _write(self, shard: int, t: Any, rows: list[dict], out: list) -> None:
        if len(out) != len(rows):
            raise ValueError(f"pluck function returned {len(out)} results for {len(rows)} rows")
        groups: dict[tuple[str, ...], list[tuple]] = {}
        for row, res in zip(rows, out, strict=True):
            if not res:
                continue
            cols = tuple(sorted(res))
            for c in cols:
                t.check_column(c, "pluck result")
            groups.setdefault(cols, []).append((row[t.key], *(res[c] for c in cols)))
        with self.wh.cluster.pool(shard).connection() as conn:
            for cols, vals in groups.items():
                typed = [("_k", t.key_type)] + [(c, t.all_columns[c]) for c in cols]
                conn.execute(write_statement(t, "patch", cols), column_params(typed, sorted(vals)))

    def _heartbeat(self, shard: int, task: dict, token: int, stop: threading.Event) -> None:
        while not stop.wait(max(task["lease_s"] / 3, 0.1)):
            try:
                with self.wh.cluster.pool(shard).connection() as conn:
                    conn.execute(
                        "UPDATE krablet_pluck_tasks SET next_try_at = now() + make_interval("
                        "secs => %s) WHERE job_id = %s AND task = %s AND token = %s",
                        (task["lease_s"], task["job_id"], task["task"], token),
                    )
            except RETRYABLE:
                pass

    def _finish(
        self,
        shard: int,
        task: dict,
        token: int,
        rows: int = 0,
        error: str | None = None,
        backoff: float = 5.0,
    ) -> None:
        with self.wh.cluster.pool(shard).connection() as conn:
            if error is None:
                cur = conn.execute(
                    "UPDATE krablet_pluck_tasks SET done = true, rows_done = %s, "
                    "last_error = NULL, "
                    "owner = NULL, token = NULL WHERE job_id = %s AND task = %s AND token = %s",
                    (rows, task["job_id"], task["task"], token),
                )
                if cur.rowcount:
                    self.done += 1
            else:
                conn.execute(
                    "UPDATE krablet_pluck_tasks SET last_error = %s, owner = NULL, token = NULL, "
                    "next_try_at = now() + make_interval(secs =>"
                    " least(3600, %s * power(2, attempts - 1)))"
                    " WHERE job_id = %s AND task = %s AND token = %s",
                    (error, backoff, task["job_id"], task["task"], token),
                )


__all__ = ["Handle", "PluckWorker", "Progress", "Table"]
