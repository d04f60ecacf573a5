"""The queue's statements: claim, complete, fail, heartbeat, release, and capped counts.

Each statement touches one job's narrow queue table ``_kq_<table>_<job>`` (see
:mod:`krea2.krablet.schema`); only ``complete_rows`` writes the wide table, and only for keys
whose lease token still matches. Claims and heartbeats commit with ``synchronous_commit=off``
(a lost lease is recomputable); completions stay durable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg import sql

from krea2.krablet.sql.arrays import unnest_from, value_expr

if TYPE_CHECKING:
    from krea2.krablet.schema import Job, Table

# a column of the claim/heartbeat result that turns synchronous commit off for its transaction
ASYNC_COMMIT = sql.SQL("(SELECT set_config('synchronous_commit', 'off', true))")


def job_predicate(job: Job) -> sql.Composable:
    """The full claim predicate: the done marker still NULL, and the job's extra ``where``."""
    base = sql.SQL("{} IS NULL").format(sql.Identifier(job.done_column))
    return sql.SQL("{} AND ({})").format(base, sql.SQL(job.where)) if job.where else base


def result_columns(table: Table, job: Job) -> list[tuple[str, str]]:
    """(name, type) of the arrays :func:`complete_rows` takes: the key as ``_k``, then results."""
    return [("_k", table.key_type)] + [(c, table.all_columns[c]) for c in job.results]


def claim_batch(table: Table, job: Job, inputs: Sequence[str]) -> sql.Composable:
    """Lease up to ``%(n)s`` ready rows: pick keys in ``next_try_at`` order through the ready
    index with ``FOR UPDATE SKIP LOCKED``, drop keys whose predicate no longer holds, set the
    lease (``%(lease)s`` seconds), owner and token; return the key, ``inputs`` and attempts."""
    q, t, k = (sql.Identifier(n) for n in (table.queue_table(job.name), table.name, table.key))
    cols = sql.SQL(", ").join(
        [sql.SQL("w.{}").format(k), *[sql.SQL("w.{}").format(sql.Identifier(c)) for c in inputs]]
    )
    return sql.SQL("""
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
        q=q, t=t, k=k, pred=job_predicate(job), cols=cols, async_commit=ASYNC_COMMIT
    )


def complete_rows(table: Table, job: Job) -> sql.Composable:
    """Delete the queue rows still holding token ``%(token)s`` and write their results (arrays
    ``p0…`` of :func:`result_columns`) in the same statement; return the keys written."""
    q, t, k = (sql.Identifier(n) for n in (table.queue_table(job.name), table.name, table.key))
    typed = result_columns(table, job)
    return sql.SQL("""
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
        kt=sql.SQL(table.key_type),
        sets=sql.SQL(", ").join(
            sql.SQL("{} = {}").format(sql.Identifier(c), value_expr("v", c, typ))
            for c, typ in typed[1:]
        ),
        source=unnest_from(typed),
    )


def fail_rows(table: Table, job: Job) -> sql.Composable:
    """Record ``%(errors)s`` for ``%(keys)s`` under ``%(token)s`` and retry after
    ``min(%(max_backoff)s, %(backoff)s * 2**(attempts-1))`` seconds, jittered ±25%."""
    return sql.SQL("""
UPDATE {q} q SET
    next_try_at = now() + make_interval(secs => least(%(max_backoff)s,
        %(backoff)s * power(2, greatest(q.attempts - 1, 0))) * (0.75 + 0.5 * random())),
    last_error = e.err, owner = NULL, token = NULL
FROM unnest(%(keys)s::{kt}[], %(errors)s::text[]) AS e(key, err)
WHERE q.key = e.key AND q.token = %(token)s RETURNING q.key""").format(
        q=sql.Identifier(table.queue_table(job.name)), kt=sql.SQL(table.key_type)
    )


def heartbeat_rows(table: Table, job: Job) -> sql.Composable:
    """Extend the lease of ``%(keys)s`` still holding ``%(token)s`` by ``%(lease)s`` seconds."""
    return sql.SQL("""
UPDATE {q} SET next_try_at = now() + make_interval(secs => %(lease)s)
WHERE key = ANY(%(keys)s::{kt}[]) AND token = %(token)s
RETURNING key, {async_commit}""").format(
        q=sql.Identifier(table.queue_table(job.name)),
        kt=sql.SQL(table.key_type),
        async_commit=ASYNC_COMMIT,
    )


def release_rows(table: Table, job: Job) -> sql.Composable:
    """Make ``%(keys)s`` (holding ``%(token)s``) ready at once, the attempt not counted."""
    return sql.SQL("""
UPDATE {q} SET next_try_at = now(), attempts = greatest(attempts - 1, 0), owner = NULL, token = NULL
WHERE key = ANY(%(keys)s::{kt}[]) AND token = %(token)s RETURNING key""").format(
        q=sql.Identifier(table.queue_table(job.name)), kt=sql.SQL(table.key_type)
    )


def retry_rows(table: Table, job: Job, where: str | None) -> sql.Composable:
    """Make unleased queue rows whose wide row matches ``where`` (operator-written SQL over the
    table's columns; None: every row) ready now with ``attempts = 0``; return their keys."""
    q, t, k = (sql.Identifier(n) for n in (table.queue_table(job.name), table.name, table.key))
    return sql.SQL("""
UPDATE {q} q SET next_try_at = now(), attempts = 0
WHERE (q.token IS NULL OR q.next_try_at <= now())
    AND q.key IN (SELECT {k} FROM {t} WHERE ({where})) RETURNING q.key""").format(
        q=q, t=t, k=k, where=sql.SQL(where or "TRUE")
    )


def done_rows(table: Table, job: Job, where: str | None) -> sql.Composable:
    """The rows ``job`` has done that it would claim again were they not done (its extra
    ``where`` holds) and that match ``where`` (operator-written SQL; None: all): the rows
    :func:`reset_rows` redoes for ``krablet retry``."""
    base = sql.SQL("{} IS NOT NULL").format(sql.Identifier(job.done_column))
    if job.where:
        base = sql.SQL("{} AND ({})").format(base, sql.SQL(job.where))
    return sql.SQL("{} AND ({})").format(base, sql.SQL(where or "TRUE"))


def keys_in(table: Table) -> sql.Composable:
    """The rows whose key is in the array ``%(keys)s``."""
    return sql.SQL("{} = ANY(%(keys)s::{}[])").format(
        sql.Identifier(table.key), sql.SQL(table.key_type)
    )


def count_rows(table: Table, chosen: sql.Composable) -> sql.Composable:
    """How many rows of the wide table match ``chosen``."""
    return sql.SQL("SELECT count(*) FROM {} WHERE {}").format(sql.Identifier(table.name), chosen)


def reset_rows(table: Table, job: Job, chosen: sql.Composable) -> sql.Composable:
    """Redo ``job`` on the rows matching ``chosen``: set its result columns to NULL, make the
    rows whose claim predicate then holds ready now with ``attempts = 0`` and no error, and
    drop the others' queue rows. Either way the row's token is gone, so a worker that leased it
    before the reset writes nothing (its result was computed from the old inputs). Returns
    ``(key, queued)`` per row reset."""
    q, t, k = (sql.Identifier(n) for n in (table.queue_table(job.name), table.name, table.key))
    return sql.SQL("""
WITH cleared AS (
    UPDATE {t} SET {clear} WHERE {chosen}
    RETURNING {k} AS key, coalesce({pred}, FALSE) AS live
), queued AS (
    INSERT INTO {q} (key) SELECT key FROM cleared WHERE live
    ON CONFLICT (key) DO UPDATE SET next_try_at = now(), attempts = 0, owner = NULL,
        token = NULL, last_error = NULL
    RETURNING key
), dropped AS (
    DELETE FROM {q} q USING cleared c WHERE q.key = c.key AND NOT c.live RETURNING q.key
)
SELECT key, live FROM cleared ORDER BY key""").format(
        q=q,
        t=t,
        k=k,
        chosen=chosen,
        pred=job_predicate(job),
        clear=sql.SQL(", ").join(
            sql.SQL("{} = NULL").format(sql.Identifier(c)) for c in job.results
        ),
    )


def failing_count(queue_table: str) -> sql.Composable:
    """Rows of a queue table whose last attempt failed (``last_error`` set), counted up to
    ``%(cap)s``: rows that failed and are not done yet."""
    return sql.SQL(
        "SELECT count(*) FROM (SELECT 1 FROM {} WHERE last_error IS NOT NULL LIMIT %(cap)s) s"
    ).format(sql.Identifier(queue_table))


def failed_rows(queue_table: str) -> sql.Composable:
    """Up to ``%s`` rows that failed at least once: key, attempts, last_error, next_try_at."""
    return sql.SQL(
        "SELECT key, attempts, last_error, next_try_at FROM {} WHERE last_error "
        "IS NOT NULL ORDER BY attempts DESC, key LIMIT %s"
    ).format(sql.Identifier(queue_table))


def queue_counts(queue_table: str) -> sql.Composable:
    """Ready, leased and backing-off rows (each an index scan capped at ``%(cap)s``, never a
    full count), the oldest ready row's age in seconds, and the planner's row estimate
    (``%(reg)s``: the queue table's quoted name)."""
    return sql.SQL("""
SELECT (SELECT count(*) FROM (SELECT 1 FROM {q} WHERE next_try_at <= now() LIMIT %(cap)s) s),
       (SELECT count(*) FROM (SELECT 1 FROM {q} WHERE next_try_at > now() AND token IS NOT NULL
                              LIMIT %(cap)s) s),
       (SELECT count(*) FROM (SELECT 1 FROM {q} WHERE next_try_at > now() AND token IS NULL
                              LIMIT %(cap)s) s),
       (SELECT extract(epoch FROM now() - min(next_try_at)) FROM {q} WHERE next_try_at <= now()),
       (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %(reg)s::regclass)
""").format(q=sql.Identifier(queue_table))
