"""pluck's statements: a map's ranges (progress, errors, cancel) and the pages of one range.

``ranges`` is pluck's range table: key column, ``map_id``, ``task``, ``cancelled``,
``rows_done`` (its job's done marker); ``job`` is its one job, whose queue holds the errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg import sql

if TYPE_CHECKING:
    from krea2.krablet.schema import Job, Table


def map_progress(ranges: Table, job: Job) -> sql.Composable:
    """For map ``%s`` on one shard: ranges, ranges done, rows done, ranges whose last attempt
    failed, and whether the map is cancelled (one row, zeros when the map is absent)."""
    return sql.SQL("""
SELECT count(*) AS tasks, count(r.rows_done) AS done, coalesce(sum(r.rows_done), 0) AS rows,
       count(q.last_error) AS failing, coalesce(bool_or(r.cancelled), false) AS cancelled
FROM {r} r LEFT JOIN {q} q ON q.key = r.{k} WHERE r.map_id = %s""").format(
        r=sql.Identifier(ranges.name),
        q=sql.Identifier(ranges.queue_table(job.name)),
        k=sql.Identifier(ranges.key),
    )


def map_errors(ranges: Table, job: Job) -> sql.Composable:
    """Ranges of map ``%s`` whose last attempt failed: task, attempts, last_error."""
    return sql.SQL("""
SELECT r.task, q.attempts, q.last_error FROM {q} q JOIN {r} r ON r.{k} = q.key
WHERE r.map_id = %s AND q.last_error IS NOT NULL ORDER BY r.task""").format(
        r=sql.Identifier(ranges.name),
        q=sql.Identifier(ranges.queue_table(job.name)),
        k=sql.Identifier(ranges.key),
    )


def cancel_map(ranges: Table) -> sql.Composable:
    """Mark every range of map ``%s`` cancelled (claims then drop them from the queue)."""
    return sql.SQL("UPDATE {} SET cancelled = true WHERE map_id = %s").format(
        sql.Identifier(ranges.name)
    )


def range_page(t: Table, where: str | None, lo: bool, hi: bool, after: bool) -> sql.Composable:
    """Up to ``%(n)s`` rows of ``t`` in key order that match ``where`` (SQL over its columns),
    with keys in ``(%(lo)s, %(hi)s]`` (each bound only if set) and after ``%(after)s``."""
    k, kt = sql.Identifier(t.key), sql.SQL(t.key_type)
    cond = [sql.SQL("({})").format(sql.SQL(where))] if where else []
    if lo:
        cond.append(sql.SQL("{} > %(lo)s::{}").format(k, kt))
    if hi:
        cond.append(sql.SQL("{} <= %(hi)s::{}").format(k, kt))
    if after:
        cond.append(sql.SQL("{} > %(after)s::{}").format(k, kt))
    return sql.SQL("SELECT * FROM {} WHERE {} ORDER BY {} LIMIT %(n)s").format(
        sql.Identifier(t.name), sql.SQL(" AND ").join(cond) if cond else sql.SQL("TRUE"), k
    )
