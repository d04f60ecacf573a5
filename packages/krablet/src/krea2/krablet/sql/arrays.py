"""Column-array parameters: many rows in one statement through ``unnest`` of typed arrays.

``unnest`` flattens multi-dimensional arrays, so array-typed columns travel as JSON text and
are rebuilt per row; jsonb values travel as text and are cast back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psycopg import sql


def param_type(typ: str) -> str:
    """The element type of the array parameter that carries a column of type ``typ``."""
    return "text" if typ.endswith("[]") or typ == "jsonb" else typ


def value_expr(alias: str, col: str, typ: str) -> sql.Composable:
    """Expression turning the unnested parameter ``alias.col`` back into a ``typ`` value."""
    ref = sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(col))
    if typ == "jsonb":
        return sql.SQL("{}::jsonb").format(ref)
    if typ.endswith("[]"):
        return sql.SQL(
            "CASE WHEN {r} IS NULL THEN NULL ELSE "
            "ARRAY(SELECT jsonb_array_elements_text({r}::jsonb)::{e})::{t} END"
        ).format(r=ref, e=sql.SQL(typ[:-2]), t=sql.SQL(typ))
    return ref


def unnest_from(columns: Sequence[tuple[str, str]], alias: str = "v") -> sql.Composable:
    """``unnest(%(p0)s::t0[], …) AS alias(c0, …)`` for (name, type) columns; params p0, p1, …"""
    arrays = sql.SQL(", ").join(
        sql.SQL("%({})s::{}[]").format(sql.SQL(f"p{i}"), sql.SQL(param_type(typ)))
        for i, (_, typ) in enumerate(columns)
    )
    names = sql.SQL(", ").join(sql.Identifier(c) for c, _ in columns)
    return sql.SQL("unnest({}) AS {}({})").format(arrays, sql.Identifier(alias), names)


def column_params(
    columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
) -> dict[str, list]:
    """Parameters for :func:`unnest_from`: one list per column from row tuples."""
    out: dict[str, list] = {}
    for i, (_, typ) in enumerate(columns):
        values = [r[i] for r in rows]
        if typ == "jsonb" or typ.endswith("[]"):
            values = [None if v is None else json.dumps(v) for v in values]
        out[f"p{i}"] = values
    return out
