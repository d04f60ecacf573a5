"""Read statements: get by keys, keyset scans, aggregates, row counts and estimates, health.

Filters are ``(column, op, value)`` triples: columns are checked against the declared table,
operators come from :data:`FILTER_OPS`, values are always bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.krablet.schema import Table

FILTER_OPS = {"=", "!=", "<", "<=", ">", ">=", "in", "not in", "is", "is not", "like"}
Filter = Sequence[Any]  # (column, op, value)


def where_clause(t: Table, where: Sequence[Filter] | None) -> tuple[sql.Composable, list[Any]]:
    """SQL for a list of filters (ANDed; ``TRUE`` for none) and its positional parameters."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    for f in where or ():
        if not isinstance(f, (list, tuple)) or len(f) != 3:
            raise UserError(f"filter {f!r} must be [column, op, value]")
        col, op, value = f
        t.check_column(col, "filter")
        op = str(op).lower()
        if op not in FILTER_OPS:
            raise UserError(f"filter op {op!r} is not one of {sorted(FILTER_OPS)}")
        ident = sql.Identifier(col)
        if op in ("is", "is not"):
            if value not in (None, True, False):
                raise UserError(f"filter {col} {op} needs null, true or false, got {value!r}")
            word = {None: "NULL", True: "TRUE", False: "FALSE"}[value]
            parts.append(sql.SQL("{} {} {}").format(ident, sql.SQL(op.upper()), sql.SQL(word)))
        elif op in ("in", "not in"):
            if not isinstance(value, (list, tuple)):
                raise UserError(f"filter {col} {op} needs a list")
            neg = "NOT " if op == "not in" else ""
            parts.append(sql.SQL("{}{} = ANY(%s)").format(sql.SQL(neg), ident))
            params.append(list(value))
        else:
            parts.append(sql.SQL("{} {} %s").format(ident, sql.SQL(op.upper())))
            params.append(value)
    if not parts:
        return sql.SQL("TRUE"), params
    return sql.SQL(" AND ").join(parts), params


def _columns(cols: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(map(sql.Identifier, cols))


def get_rows(t: Table, cols: Sequence[str]) -> sql.Composable:
    """``cols`` of the rows whose key is in the array ``%s``."""
    return sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
        _columns(cols), sql.Identifier(t.name), sql.Identifier(t.key)
    )


def scan_rows(t: Table, cols: Sequence[str], cond: sql.Composable, after: bool) -> sql.Composable:
    """``cols`` of rows matching ``cond`` in key order, up to the last ``%s`` rows; with
    ``after``, only keys greater than the ``%s`` before it (the keyset cursor)."""
    if after:
        cond = sql.SQL("({}) AND {} > %s").format(cond, sql.Identifier(t.key))
    return sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT %s").format(
        _columns(cols), sql.Identifier(t.name), cond, sql.Identifier(t.key)
    )


def aggregate_rows(
    t: Table, aggs: Sequence[tuple[str, str]], cond: sql.Composable
) -> sql.Composable:
    """One row of aggregates ``(fn, column)`` over rows matching ``cond``, named ``a0, a1, …``.

    ``avg`` is sent as two columns, ``sum`` then ``count``, so shards' answers can be merged;
    ``("count", "*")`` counts rows.
    """
    exprs: list[sql.Composable] = []
    for fn, col in aggs:
        target = sql.SQL("*") if col == "*" and fn == "count" else sql.Identifier(col)
        if fn == "avg":
            exprs += [sql.SQL("sum({})").format(target), sql.SQL("count({})").format(target)]
        else:
            exprs.append(sql.SQL("{}({})").format(sql.SQL(fn), target))
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(
        sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(e, sql.Identifier(f"a{i}")) for i, e in enumerate(exprs)
        ),
        sql.Identifier(t.name),
        cond,
    )


def capped_row_count(table: str) -> sql.Composable:
    """Rows of ``table``, counted up to ``%s`` (an index-free scan that stops at the cap)."""
    return sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT %s) s").format(
        sql.Identifier(table)
    )


def row_estimate() -> sql.Composable:
    """The planner's row estimate of table ``%s`` (its quoted name); -1 if never analysed."""
    return sql.SQL("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)")


def analyze_table(table: str) -> sql.Composable:
    return sql.SQL("ANALYZE {}").format(sql.Identifier(table))


def all_keys(t: Table) -> sql.Composable:
    """Every key of the table, in order."""
    return sql.SQL("SELECT {k} FROM {t} ORDER BY {k}").format(
        k=sql.Identifier(t.key), t=sql.Identifier(t.name)
    )


def sample_keys(t: Table, method: str) -> sql.Composable:
    """Keys from a ``TABLESAMPLE`` (``SYSTEM``: whole pages, ``BERNOULLI``: rows) of ``%s``%."""
    if method not in ("SYSTEM", "BERNOULLI"):
        raise ValueError(f"unknown TABLESAMPLE method {method!r}")
    return sql.SQL("SELECT {} FROM {} TABLESAMPLE {} (%s)").format(
        sql.Identifier(t.key), sql.Identifier(t.name), sql.SQL(method)
    )


def shard_health() -> sql.Composable:
    """Dead tuples, the HOT-update ratio and the oldest open transaction's age (seconds)."""
    return sql.SQL("""
SELECT coalesce(sum(n_dead_tup), 0)::bigint,
       coalesce(sum(n_tup_hot_upd)::float / nullif(sum(n_tup_upd), 0), 0),
       (SELECT coalesce(extract(epoch FROM now() - min(xact_start)), 0) FROM pg_stat_activity
         WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid())
FROM pg_stat_user_tables""")
