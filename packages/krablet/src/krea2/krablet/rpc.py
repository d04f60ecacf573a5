"""Reads: get-by-keys, keyset-paginated predicate scans, counts and aggregates, by scatter-gather.

:class:`Reader` runs in-process on the cluster's pools; the RPC service (``krea2 krablet rpc``)
wraps one Reader so that many clients share one pool per shard, and :class:`RpcClient` has the
same methods over HTTP. Filters are ``(column, op, value)`` triples; columns are checked against
the declared schema and values are always bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from psycopg import sql
from psycopg.rows import dict_row

from krea2.infra.errors import UserError
from krea2.krablet.schema import Table
from krea2.krablet.service import Client, decode_row, encode_row, json_app

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from krea2.krablet.warehouse import Warehouse

OPS = {"=", "!=", "<", "<=", ">", ">=", "in", "not in", "is", "is not", "like"}
AGGS = {"count", "sum", "min", "max", "avg"}
MAX_LIMIT = 100_000

Filter = Sequence[Any]  # (column, op, value)


def where_clause(t: Table, where: Sequence[Filter] | None) -> tuple[sql.Composable, list[Any]]:
    """SQL for a list of filters (ANDed) and its parameters."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    for f in where or ():
        if not isinstance(f, (list, tuple)) or len(f) != 3:
            raise UserError(f"filter {f!r} must be [column, op, value]")
        col, op, value = f
        t.check_column(col, "filter")
        op = str(op).lower()
        if op not in OPS:
            raise UserError(f"filter op {op!r} is not one of {sorted(OPS)}")
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


class Reader:
    """Scatter-gather reads over every shard of a warehouse."""

    def __init__(self, wh: Warehouse, max_parallel: int = 16) -> None:
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
            with (
                self.wh.cluster.pool(i).connection() as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                cur.execute(query, p)
                return cur.fetchall()

        return list(self._pool.map(run, shards))

    def get(self, table: str, keys: Sequence[Any], columns: Sequence[str] | None = None) -> dict:
        """Rows by primary key, as ``{key: row}``; missing keys are absent."""
        t = self.wh.table(table)
        cols = self._columns(t, columns)
        by_shard = self.wh.cluster.split(keys)
        query = sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.Identifier(t.name),
            sql.Identifier(t.key),
        )
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
        cond, params = where_clause(t, where)
        if cursor is not None:
            cond = sql.SQL("({}) AND {} > %s").format(cond, sql.Identifier(t.key))
            params = [*params, cursor]
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT %s").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.Identifier(t.name),
            cond,
            sql.Identifier(t.key),
        )
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
        exprs: list[sql.Composable] = []
        plan: list[tuple[str, str]] = []
        for name, spec in aggs.items():
            if not isinstance(spec, (list, tuple)) or len(spec) != 2:
                raise UserError(f"aggregate {name!r} must be [fn, column]")
            fn, col = str(spec[0]).lower(), spec[1]
            if fn not in AGGS:
                raise UserError(f"aggregate function {fn!r} is not one of {sorted(AGGS)}")
            target = (
                sql.SQL("*")
                if col == "*" and fn == "count"
                else sql.Identifier(t.check_column(col, "aggregate"))
            )
            plan.append((name, fn))
            if fn == "avg":
                exprs += [sql.SQL("sum({})").format(target), sql.SQL("count({})").format(target)]
            else:
                exprs.append(sql.SQL("{}({})").format(sql.SQL(fn), target))
        cond, params = where_clause(t, where)
        query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
            sql.SQL(", ").join(
                sql.SQL("{} AS {}").format(e, sql.Identifier(f"a{i}")) for i, e in enumerate(exprs)
            ),
            sql.Identifier(t.name),
            cond,
        )
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


def make_rpc_app(wh: Warehouse, token: str | None = None) -> Starlette:
    reader = Reader(wh)

    def rows_out(rows: list[dict]) -> list[dict]:
        return [encode_row(r) for r in rows]

    def get(p: dict) -> Any:
        found = reader.get(p["table"], p["keys"], p.get("columns"))
        return rows_out(list(found.values()))

    def scan(p: dict) -> Any:
        rows, nxt = reader.scan(
            p["table"], p.get("where"), p.get("columns"), int(p.get("limit", 1000)), p.get("cursor")
        )
        return {"rows": rows_out(rows), "cursor": nxt}

    def count(p: dict) -> Any:
        return reader.count(p["table"], p.get("where"))

    def aggregate(p: dict) -> Any:
        return {
            k: float(v) if hasattr(v, "as_integer_ratio") and not isinstance(v, int) else v
            for k, v in reader.aggregate(p["table"], p["aggs"], p.get("where")).items()
        }

    return json_app(
        {"/v1/get": get, "/v1/scan": scan, "/v1/count": count, "/v1/aggregate": aggregate},
        token=token,
    )


class RpcClient:
    """The :class:`Reader` API over HTTP: ``RpcClient("http://127.0.0.1:7432", token=...)``."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0) -> None:
        self._c = Client(url, token, timeout)

    def get(self, table: str, keys: Sequence[Any], columns: Sequence[str] | None = None) -> dict:
        payload = {"table": table, "keys": list(keys), "columns": columns}
        rows = [decode_row(r) for r in self._c.call("/v1/get", payload)]
        return {next(iter(r.values())): r for r in rows}  # the key column comes first

    def scan(
        self,
        table: str,
        where: Sequence[Filter] | None = None,
        columns: Sequence[str] | None = None,
        limit: int = 1000,
        cursor: Any = None,
    ) -> tuple[list[dict], Any]:
        out = self._c.call(
            "/v1/scan",
            {"table": table, "where": where, "columns": columns, "limit": limit, "cursor": cursor},
        )
        return [decode_row(r) for r in out["rows"]], out["cursor"]

    def count(self, table: str, where: Sequence[Filter] | None = None) -> int:
        return int(self._c.call("/v1/count", {"table": table, "where": where}))

    def aggregate(
        self, table: str, aggs: dict[str, Sequence[str]], where: Sequence[Filter] | None = None
    ) -> dict[str, Any]:
        return self._c.call("/v1/aggregate", {"table": table, "aggs": aggs, "where": where})

    def close(self) -> None:
        self._c.close()
