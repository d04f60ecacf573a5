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
from psycopg import sql
from psycopg.rows import dict_row

from krea2.infra.errors import UserError
from krea2.krablet.batch_sql import column_params, unnest_from, value_expr
from krea2.krablet.cluster import Cluster
from krea2.krablet.schema import Job, Table

ASYNC_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true))"


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
        self._q = sql.Identifier(table.queue_table(self.job.name))
        self._t = sql.Identifier(table.name)
        self._k = sql.Identifier(table.key)
        inputs = list(self.job.inputs) if self.job.inputs else list(table.columns)
        self.inputs = [c for c in inputs if c != table.key]
        self._result_columns = [("_k", table.key_type)] + [
            (c, table.all_columns[c]) for c in self.job.results
        ]
        self._sql = self._statements()

    # -- SQL, built once per queue --------------------------------------------------------
    def _statements(self) -> dict[str, sql.Composable]:
        q, t, k = self._q, self._t, self._k
        key_type = sql.SQL(self.table.key_type)
        cols = sql.SQL(", ").join(
            [
                sql.SQL("w.{}").format(k),
                *[sql.SQL("w.{}").format(sql.Identifier(c)) for c in self.inputs],
            ]
        )
        return {
            "claim": sql.SQL("""
WITH c AS MATERIALIZED (
    SELECT key FROM {q} WHERE next_try_at <= now()
    ORDER BY next_try_at LIMIT %(n)s FOR UPDATE SKIP LOCKED
), live AS MATERIALIZED (
    SELECT {k} AS key FROM {t} WHERE {k} IN (SELECT key FROM c) AND ({pred})
), stale AS (
    DELETE FROM {q} q USING (SELECT key FROM c EXCEPT ALL SELECT key FROM live) s
    WHERE q.key = s.key
), upd AS (
    UPDATE {q} q SET next_try_at = now() + make_interval(secs => %(lease)s),
        attempts = q.attempts + 1, owner = %(owner)s, token = %(token)s, last_tried_at = now()
    FROM live WHERE q.key = live.key RETURNING q.key, q.attempts
)
SELECT {cols}, upd.attempts AS "_attempts", {async_commit} AS "_async"
FROM upd JOIN {t} w ON w.{k} = upd.key ORDER BY upd.key""").format(
                q=q,
                t=t,
                k=k,
                pred=sql.SQL(self.job.predicate()),
                cols=cols,
                async_commit=sql.SQL(ASYNC_COMMIT),
            ),
            "complete": sql.SQL("""
WITH done AS (
    DELETE FROM {q} q USING unnest(%(p0)s::{kt}[]) AS d(key)
    WHERE q.key = d.key AND q.token = %(token)s RETURNING q.key
)
UPDATE {t} w SET {sets}
FROM {source}
WHERE w.{k} = v._k AND v._k IN (SELECT key FROM done)
RETURNING w.{k}""").format(
                q=q,
                t=t,
                k=k,
                kt=key_type,
                sets=sql.SQL(", ").join(
                    sql.SQL("{} = {}").format(sql.Identifier(c), value_expr("v", c, typ))
                    for c, typ in self._result_columns[1:]
                ),
                source=unnest_from(self._result_columns),
            ),
            "fail": sql.SQL("""
UPDATE {q} q SET
    next_try_at = now() + make_interval(secs => least(%(max_backoff)s,
        %(backoff)s * power(2, greatest(q.attempts - 1, 0))) * (0.75 + 0.5 * random())),
    last_error = e.err, owner = NULL, token = NULL
FROM unnest(%(keys)s::{kt}[], %(errors)s::text[]) AS e(key, err)
WHERE q.key = e.key AND q.token = %(token)s RETURNING q.key""").format(q=q, kt=key_type),
            "heartbeat": sql.SQL("""
UPDATE {q} SET next_try_at = now() + make_interval(secs => %(lease)s)
WHERE key = ANY(%(keys)s::{kt}[]) AND token = %(token)s
RETURNING key, {async_commit}""").format(q=q, kt=key_type, async_commit=sql.SQL(ASYNC_COMMIT)),
            "release": sql.SQL("""
UPDATE {q} SET next_try_at = now(), attempts = greatest(attempts - 1, 0), owner = NULL, token = NULL
WHERE key = ANY(%(keys)s::{kt}[]) AND token = %(token)s RETURNING key""").format(q=q, kt=key_type),
        }

    def _conn(self, shard: int):
        return self.cluster.pool(shard).connection()

    # -- operations -------------------------------------------------------------------------
    def claim(self, shard: int, n: int, lease_s: float | None = None) -> Claim:
        """Lease up to ``n`` ready rows of ``shard`` (may return fewer, or none)."""
        if n < 1:
            raise UserError(f"claim batch size must be at least 1, got {n}")
        token = secrets.randbits(62)
        lease = float(lease_s if lease_s is not None else self.job.lease_s)
        with self._conn(shard) as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                self._sql["claim"], {"n": n, "lease": lease, "owner": self.owner, "token": token}
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
        done = self.job.done_column
        for key, values in by_key.items():
            unknown = set(values) - set(self.job.results)
            if unknown:
                raise UserError(
                    f"job {self.job.name!r} result for {key!r} has columns {sorted(unknown)} "
                    f"that are not its results {self.job.results}"
                )
            if values.get(done) is None:
                raise UserError(
                    f"job {self.job.name!r} result for {key!r} leaves the done column {done!r} NULL"
                )
        keys = sorted(by_key)
        rows = [(k, *(by_key[k].get(c) for c in self.job.results)) for k in keys]
        params: dict[str, Any] = column_params(self._result_columns, rows)
        params["token"] = claim.token
        with self._conn(claim.shard) as conn:
            written = [r[0] for r in conn.execute(self._sql["complete"], params).fetchall()]
        return written

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
            return [r[0] for r in conn.execute(self._sql["fail"], params).fetchall()]

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
            return [r[0] for r in conn.execute(self._sql["heartbeat"], params).fetchall()]

    def release(self, claim: Claim, keys: Sequence[Any] | None = None) -> list[Any]:
        """Give rows back unprocessed: ready again at once, the attempt not counted."""
        params = {"keys": sorted(keys if keys is not None else claim.keys), "token": claim.token}
        if not params["keys"]:
            return []
        with self._conn(claim.shard) as conn:
            return [r[0] for r in conn.execute(self._sql["release"], params).fetchall()]

    # -- inspection -------------------------------------------------------------------------
    def stats(self, shard: int, cap: int = 100_000) -> dict[str, Any]:
        """Backlog (ready rows, counted up to ``cap``), leased, backing off, oldest-ready age."""
        with self._conn(shard) as conn:
            return queue_stats(conn, self.table.queue_table(self.job.name), cap)

    def errors(self, shard: int, limit: int = 20) -> list[dict[str, Any]]:
        """Rows that have failed at least once: key, attempts, last error, next try."""
        with self._conn(shard) as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                sql.SQL(
                    "SELECT key, attempts, last_error, next_try_at FROM {} WHERE last_error "
                    "IS NOT NULL ORDER BY attempts DESC, key LIMIT %s"
                ).format(self._q),
                (limit,),
            )
            return cur.fetchall()


def queue_stats(conn: psycopg.Connection, queue_table: str, cap: int = 100_000) -> dict[str, Any]:
    """Counts for one queue table, each capped (an index scan with LIMIT), never a full count."""
    q = sql.Identifier(queue_table)
    row = conn.execute(
        sql.SQL("""
SELECT (SELECT count(*) FROM (SELECT 1 FROM {q} WHERE next_try_at <= now() LIMIT %(cap)s) s),
       (SELECT count(*) FROM (SELECT 1 FROM {q} WHERE next_try_at > now() AND token IS NOT NULL
                              LIMIT %(cap)s) s),
       (SELECT count(*) FROM (SELECT 1 FROM {q} WHERE next_try_at > now() AND token IS NULL
                              LIMIT %(cap)s) s),
       (SELECT extract(epoch FROM now() - min(next_try_at)) FROM {q} WHERE next_try_at <= now()),
       (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %(reg)s::regclass)
""").format(q=q),
        {"cap": cap, "reg": f'"{queue_table}"'},
    ).fetchone()
    return {
        "ready": row[0],
        "leased": row[1],
        "backing_off": row[2],
        "oldest_ready_s": float(row[3] or 0.0),
        "estimated_rows": row[4],
        "capped_at": cap,
    }
