"""The table-as-queue: short committed leases claimed with FOR UPDATE SKIP LOCKED.

Each job's pending rows live in a narrow queue table (see :mod:`krea2.krablet.schema`). A claim
is one statement: pick up to ``n`` ready keys in ``next_try_at`` order through its index with
``FOR UPDATE SKIP LOCKED``, re-check the job predicate on the wide row (keys whose predicate no
longer holds are dropped from the queue), and set the lease (``next_try_at = now() + lease``),
``attempts + 1``, the owner and a fresh token; then it commits. Nothing stays locked while the
job runs. :meth:`Queue.complete` deletes the queue rows and writes the results in one statement,
only for keys whose token still matches (first writer wins); :meth:`Queue.fail` records the
error and backs off exponentially; :meth:`Queue.heartbeat` extends a live lease.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from krea2.infra.errors import UserError
from krea2.krablet.cluster import Cluster
from krea2.krablet.schema import Job, Table
from krea2.krablet.sql import queue as queue_sql
from krea2.krablet.sql.arrays import column_params


@dataclass
class Claim:
    """A batch of rows leased from one shard. ``rows`` hold the job's input columns and the key."""

    table: str
    job: str
    shard: int
    token: int
    rows: list[dict[str, Any]]
    attempts: dict[Any, int]
    claimed_at: float = field(default_factory=time.monotonic)
    key_column: str = "key"

    @property
    def keys(self) -> list[Any]:
        return [r[self.key_column] for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


class Queue:
    """Claim, complete, fail, heartbeat and release one job's rows on any shard of a cluster."""

    def __init__(self, cluster: Cluster, table: Table, job: Job | str, owner: str = "") -> None:
        self.cluster = cluster
        self.table = table
        self.job = table.job(job) if isinstance(job, str) else job
        self.owner = owner or f"pid-{secrets.token_hex(4)}"
        inputs = list(self.job.inputs) if self.job.inputs else list(table.columns)
        self.inputs = [c for c in inputs if c != table.key]
        self._result_columns = queue_sql.result_columns(table, self.job)
        # built once per queue: the statements this queue sends
        self.statements = {
            "claim": queue_sql.claim_batch(table, self.job, self.inputs),
            "complete": queue_sql.complete_rows(table, self.job),
            "fail": queue_sql.fail_rows(table, self.job),
            "heartbeat": queue_sql.heartbeat_rows(table, self.job),
            "release": queue_sql.release_rows(table, self.job),
        }

    def _conn(self, shard: int):
        return self.cluster.connection(shard)

    # -- operations -------------------------------------------------------------------------
    def claim(self, shard: int, n: int, lease_s: float | None = None) -> Claim:
        """Lease up to ``n`` ready rows of ``shard`` (may return fewer, or none)."""
        if n < 1:
            raise UserError(f"claim batch size must be at least 1, got {n}")
        token = secrets.randbits(62)
        lease = float(lease_s if lease_s is not None else self.job.lease_s)
        with self._conn(shard) as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                self.statements["claim"],
                {"n": n, "lease": lease, "owner": self.owner, "token": token},
            )
            rows = cur.fetchall()
        attempts = {}
        for r in rows:
            attempts[r[self.table.key]] = r.pop("_attempts")
            r.pop("_async", None)
        return Claim(
            self.table.name, self.job.name, shard, token, rows, attempts, key_column=self.table.key
        )

    def complete(
        self, claim: Claim, results: Sequence[Mapping[str, Any]] | Mapping[Any, Mapping[str, Any]]
    ) -> list[Any]:
        """Write results for the claim's rows where the lease is still ours; return keys written.

        ``results`` is one mapping per row (in ``claim.rows`` order) or a mapping key → values.
        Each values mapping holds the job's result columns; the done column must not be None.
        """
        if isinstance(results, Mapping):
            by_key = dict(results)
        else:
            if len(results) != len(claim.rows):
                raise UserError(
                    f"complete: {len(results)} results for {len(claim.rows)} claimed rows"
                )
            by_key = dict(zip(claim.keys, results, strict=True))
        if not by_key:
            return []
        for key, values in by_key.items():
            problem = self.result_problem(key, values)
            if problem is not None:
                raise UserError(problem[1])
        keys = sorted(by_key)
        rows = [(k, *(by_key[k].get(c) for c in self.job.results)) for k in keys]
        params: dict[str, Any] = column_params(self._result_columns, rows)
        params["token"] = claim.token
        with self._conn(claim.shard) as conn:
            written = [r[0] for r in conn.execute(self.statements["complete"], params).fetchall()]
        return written

    def result_problem(self, key: Any, values: Mapping[str, Any]) -> tuple[str, str] | None:
        """Why ``values`` cannot be written as the job's result for ``key``, as (kind, message),
        or None: columns that are not the job's results, or a NULL done column."""
        unknown = set(values) - set(self.job.results)
        if unknown:
            kind = f"job {self.job.name!r} result has columns {sorted(unknown)}"
            return kind, f"{kind} that are not its results {self.job.results} (row {key!r})"
        if values.get(self.job.done_column) is None:
            done = self.job.done_column
            kind = f"job {self.job.name!r} result leaves the done column {done!r} NULL"
            return kind, f"{kind} (row {key!r})"
        return None

    def fail(
        self, claim: Claim, errors: Mapping[Any, str] | str, keys: Sequence[Any] | None = None
    ) -> list[Any]:
        """Record errors, push the rows back with exponential backoff; return the keys updated."""
        if isinstance(errors, str):
            errors = dict.fromkeys(keys if keys is not None else claim.keys, errors)
        if not errors:
            return []
        keys_sorted = sorted(errors)
        params = {
            "keys": keys_sorted,
            "errors": [str(errors[k])[:2000] for k in keys_sorted],
            "token": claim.token,
            "backoff": self.job.backoff_s,
            "max_backoff": self.job.max_backoff_s,
        }
        with self._conn(claim.shard) as conn:
            return [r[0] for r in conn.execute(self.statements["fail"], params).fetchall()]

    def heartbeat(
        self, claim: Claim, keys: Sequence[Any] | None = None, lease_s: float | None = None
    ) -> list[Any]:
        """Extend the lease of the claim's (still held) rows; returns the keys still held."""
        lease = float(lease_s if lease_s is not None else self.job.lease_s)
        params = {
            "keys": sorted(keys if keys is not None else claim.keys),
            "token": claim.token,
            "lease": lease,
        }
        with self._conn(claim.shard) as conn:
            return [r[0] for r in conn.execute(self.statements["heartbeat"], params).fetchall()]

    def release(self, claim: Claim, keys: Sequence[Any] | None = None) -> list[Any]:
        """Give rows back unprocessed: ready again at once, the attempt not counted."""
        params = {"keys": sorted(keys if keys is not None else claim.keys), "token": claim.token}
        if not params["keys"]:
            return []
        with self._conn(claim.shard) as conn:
            return [r[0] for r in conn.execute(self.statements["release"], params).fetchall()]

    # -- inspection -------------------------------------------------------------------------
    def stats(self, shard: int, cap: int = 100_000) -> dict[str, Any]:
        """Backlog (ready rows, counted up to ``cap``), leased, backing off, oldest-ready age."""
        with self._conn(shard) as conn:
            return queue_stats(conn, self.table.queue_table(self.job.name), cap)

    def errors(self, shard: int, limit: int = 20) -> list[dict[str, Any]]:
        """Rows that have failed at least once: key, attempts, last error, next try."""
        with self._conn(shard) as conn:
            return failed_rows(conn, self.table.queue_table(self.job.name), limit)

    def failing(self, shard: int, cap: int = 100_000) -> int:
        """Rows of the job on ``shard`` that failed and are not done yet (counted up to
        ``cap``): those :meth:`errors` lists, all of them."""
        with self._conn(shard) as conn:
            return failing_count(conn, self.table.queue_table(self.job.name), cap)

    def retry(self, shard: int, where: str | None = None) -> list[Any]:
        """Make the job's unleased rows on ``shard`` that match ``where`` (SQL over the table's
        columns; None: all) ready now with their attempts reset to 0, so their backoff starts
        over; ``last_error`` is kept until they succeed. Returns the keys reset. Rows the job
        has done are not touched: :meth:`redo` runs those again."""
        statement = queue_sql.retry_rows(self.table, self.job, where)
        return [r[0] for r in self._operator_sql(shard, statement, where)]

    def count_done(self, shard: int, where: str | None = None) -> int:
        """How many rows on ``shard`` :meth:`redo` with the same ``where`` would run again."""
        chosen = queue_sql.done_rows(self.table, self.job, where)
        return self._operator_sql(shard, queue_sql.count_rows(self.table, chosen), where)[0][0]

    def redo(self, shard: int, where: str | None = None) -> list[Any]:
        """Run the job again on rows of ``shard`` it has done that match ``where`` (SQL over
        the table's columns; None: all): their result columns are set to NULL and they are
        ready now with attempts 0. Rows the job's own ``where`` excludes are left as they are.
        Other jobs' results (a job that read this one's) are kept: redo those too if they
        depend on it. Returns the keys queued again."""
        chosen = queue_sql.done_rows(self.table, self.job, where)
        statement = queue_sql.reset_rows(self.table, self.job, chosen)
        return [key for key, _live in self._operator_sql(shard, statement, where)]

    def reset(self, shard: int, keys: Sequence[Any]) -> list[Any]:
        """Forget the job's state for ``keys`` on ``shard`` (e.g. their inputs changed): result
        columns set to NULL, attempts and error cleared, and a lease on them voided (its
        holder writes nothing); the rows whose claim predicate holds are ready now, the others
        leave the queue. Returns the keys reset (the ones that exist)."""
        if not keys:
            return []
        statement = queue_sql.reset_rows(self.table, self.job, queue_sql.keys_in(self.table))
        with self._conn(shard) as conn:
            return [r[0] for r in conn.execute(statement, {"keys": sorted(keys)}).fetchall()]

    def _operator_sql(self, shard: int, statement: Any, where: str | None) -> list[tuple]:
        """Run a statement holding the operator's ``where`` (no parameters, so a ``%`` in it
        is plain SQL); a UserError naming it when the database refuses it."""
        try:
            with self._conn(shard) as conn:
                return conn.execute(statement).fetchall()
        except (psycopg.ProgrammingError, psycopg.DataError) as exc:
            message = str(exc).splitlines()[0]
            raise UserError(
                f"--where {where!r} is not valid SQL on {self.table.name}: {message}"
            ) from None


def failed_rows(conn: psycopg.Connection, queue_table: str, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` rows of a queue table that failed at least once, most attempts first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(queue_sql.failed_rows(queue_table), (limit,))
        return cur.fetchall()


def failing_count(conn: psycopg.Connection, queue_table: str, cap: int = 100_000) -> int:
    """Rows of one queue table that failed and are not done, counted up to ``cap``."""
    return conn.execute(queue_sql.failing_count(queue_table), {"cap": cap}).fetchone()[0]


def queue_stats(conn: psycopg.Connection, queue_table: str, cap: int = 100_000) -> dict[str, Any]:
    """Counts for one queue table, each capped (an index scan with LIMIT), never a full count."""
    row = conn.execute(
        queue_sql.queue_counts(queue_table), {"cap": cap, "reg": f'"{queue_table}"'}
    ).fetchone()
    return {
        "ready": row[0],
        "leased": row[1],
        "backing_off": row[2],
        "oldest_ready_s": float(row[3] or 0.0),
        "estimated_rows": row[4],
        "capped_at": cap,
    }
