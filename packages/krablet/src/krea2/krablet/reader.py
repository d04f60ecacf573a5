"""Reads: get-by-keys, keyset-paginated predicate scans, counts and aggregates, by scatter-gather.

:class:`Reader` runs in-process on the cluster's pools; the RPC service (``krea2 krablet rpc``,
:mod:`krea2.krablet.service`) wraps one Reader so that many clients share one pool per shard,
and :class:`~krea2.krablet.service.RpcClient` has the same methods over HTTP. Filters are
``(column, op, value)`` triples; columns are checked against the declared schema and values are
always bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from krea2.infra.errors import UserError
from krea2.krablet.schema import Table, WarehouseView
from krea2.krablet.sql import reads
from krea2.krablet.sql.reads import Filter

AGGREGATES = {"count", "sum", "min", "max", "avg"}
# a value the database cannot use (``"abc"`` for an integer column, an operator the column's
# type lacks, a JSON object as a filter value): the caller's mistake, reported as a UserError
REFUSED_VALUES = (psycopg.DataError, psycopg.ProgrammingError)
SCHEMA_FAULTS = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)
MAX_LIMIT = 100_000


class Reader:
    """Scatter-gather reads over every shard of a warehouse."""

    def __init__(self, wh: WarehouseView, max_parallel: int = 16) -> None:
        self.wh = wh
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="krablet-read")

    def _columns(self, t: Table, columns: Sequence[str] | None) -> list[str]:
        cols = list(columns) if columns else list(t.all_columns)
        for c in cols:
            t.check_column(c, "columns")
        return [t.key] + [c for c in cols if c != t.key]  # key first, always

    def _on_shards(
        self,
        shards: Sequence[int],
        query: sql.Composable,
        params: Sequence | dict,
        per_shard_params: dict[int, Any] | None = None,
    ) -> list[list[dict]]:
        def run(i: int) -> list[dict]:
            p = per_shard_params[i] if per_shard_params else params
            with self.wh.cluster.connection(i) as conn, conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query, p)
                return cur.fetchall()

        try:
            return list(self._pool.map(run, shards))
        except SCHEMA_FAULTS:
            raise  # the catalog names what a shard lacks: not the request's fault
        except REFUSED_VALUES as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"the database refused the request's values: {reason}") from None

    def get(self, table: str, keys: Sequence[Any], columns: Sequence[str] | None = None) -> dict:
        """Rows by primary key, as ``{key: row}``; missing keys are absent."""
        t = self.wh.table(table)
        cols = self._columns(t, columns)
        by_shard = self.wh.cluster.split(keys)
        query = reads.get_rows(t, cols)
        shards = sorted(by_shard)
        out: dict[Any, dict] = {}
        for rows in self._on_shards(shards, query, (), {i: (by_shard[i],) for i in shards}):
            out.update({r[t.key]: r for r in rows})
        return out

    def scan(
        self,
        table: str,
        where: Sequence[Filter] | None = None,
        columns: Sequence[str] | None = None,
        limit: int = 1000,
        cursor: Any = None,
    ) -> tuple[list[dict], Any]:
        """Up to ``limit`` rows in key order after ``cursor``: (rows, next cursor or None)."""
        t = self.wh.table(table)
        if not 1 <= int(limit) <= MAX_LIMIT:
            raise UserError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
        cols = self._columns(t, columns)
        cond, params = reads.where_clause(t, where)
        if cursor is not None:
            params = [*params, cursor]
        query = reads.scan_rows(t, cols, cond, after=cursor is not None)
        parts = self._on_shards(range(len(self.wh.cluster)), query, [*params, int(limit)])
        rows = sorted((r for part in parts for r in part), key=lambda r: r[t.key])[: int(limit)]
        nxt = rows[-1][t.key] if len(rows) == int(limit) else None
        return rows, nxt

    def count(self, table: str, where: Sequence[Filter] | None = None) -> int:
        return int(self.aggregate(table, {"n": ("count", "*")}, where)["n"])

    def aggregate(
        self, table: str, aggs: dict[str, Sequence[str]], where: Sequence[Filter] | None = None
    ) -> dict[str, Any]:
        """``{name: (fn, column)}`` with fn in count/sum/min/max/avg, merged across shards."""
        t = self.wh.table(table)
        if not aggs:
            raise UserError("aggregate needs at least one {name: [fn, column]}")
        plan: list[tuple[str, str]] = []  # (name, fn)
        specs: list[tuple[str, str]] = []  # (fn, column)
        for name, spec in aggs.items():
            if not isinstance(spec, (list, tuple)) or len(spec) != 2:
                raise UserError(f"aggregate {name!r} must be [fn, column]")
            fn, col = str(spec[0]).lower(), spec[1]
            if fn not in AGGREGATES:
                raise UserError(f"aggregate function {fn!r} is not one of {sorted(AGGREGATES)}")
            if not (col == "*" and fn == "count"):
                t.check_column(col, "aggregate")
            plan.append((name, fn))
            specs.append((fn, col))
        cond, params = reads.where_clause(t, where)
        query = reads.aggregate_rows(t, specs, cond)
        parts = [p[0] for p in self._on_shards(range(len(self.wh.cluster)), query, params)]
        out: dict[str, Any] = {}
        i = 0
        for name, fn in plan:
            vals = [p[f"a{i}"] for p in parts]
            if fn == "avg":
                cnt = sum(p[f"a{i + 1}"] or 0 for p in parts)
                tot = sum(v for v in vals if v is not None)
                out[name] = (float(tot) / cnt) if cnt else None
                i += 2
                continue
            present = [v for v in vals if v is not None]
            if fn in ("count", "sum"):
                out[name] = sum(present) if present or fn == "count" else None
            else:
                out[name] = (min if fn == "min" else max)(present) if present else None
            i += 1
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False)
