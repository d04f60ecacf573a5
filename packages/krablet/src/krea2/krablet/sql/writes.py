"""The funnel's statements: many rows per upsert or patch, no-op updates skipped.

Both take their rows as the column arrays ``p0…`` of :func:`krea2.krablet.sql.arrays.unnest_from`
over :func:`written_columns` (the key first, as ``_k``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg import sql

from krea2.krablet.sql.arrays import unnest_from, value_expr

if TYPE_CHECKING:
    from krea2.krablet.schema import Table


def written_columns(t: Table, columns: Sequence[str]) -> list[tuple[str, str]]:
    """(name, type) of the arrays a write takes: the key as ``_k``, then ``columns``."""
    return [("_k", t.key_type)] + [(c, t.all_columns[c]) for c in columns]


def upsert_rows(t: Table, columns: Sequence[str]) -> sql.Composable:
    """``INSERT … ON CONFLICT DO UPDATE`` of ``columns``, skipping rows whose values are equal."""
    typed = written_columns(t, columns)
    key = sql.Identifier(t.key)
    cols = [sql.Identifier(c) for c in columns]
    insert = sql.SQL("INSERT INTO {t} AS w ({k}{cols}) SELECT {exprs} FROM {src}").format(
        t=sql.Identifier(t.name),
        k=key,
        cols=sql.SQL("").join(sql.SQL(", {}").format(c) for c in cols),
        exprs=sql.SQL(", ").join(value_expr("v", c, typ) for c, typ in typed),
        src=unnest_from(typed),
    )
    if not columns:
        return sql.SQL("{} ON CONFLICT ({}) DO NOTHING").format(insert, key)
    sets = sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=c) for c in cols)
    old = sql.SQL(", ").join(sql.SQL("w.{}").format(c) for c in cols)
    new = sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(c) for c in cols)
    return sql.SQL(
        "{} ON CONFLICT ({}) DO UPDATE SET {} WHERE ROW({}) IS DISTINCT FROM ROW({})"
    ).format(insert, key, sets, old, new)


def patch_rows(t: Table, columns: Sequence[str]) -> sql.Composable:
    """``UPDATE … FROM unnest(…)`` of ``columns`` on existing rows whose values differ."""
    typed = written_columns(t, columns)[1:]
    sets = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(c), value_expr("v", c, typ)) for c, typ in typed
    )
    changed = sql.SQL(" OR ").join(
        sql.SQL("w.{} IS DISTINCT FROM {}").format(sql.Identifier(c), value_expr("v", c, typ))
        for c, typ in typed
    )
    return sql.SQL("UPDATE {t} w SET {sets} FROM {src} WHERE w.{k} = v._k AND ({changed})").format(
        t=sql.Identifier(t.name),
        sets=sets,
        src=unnest_from(written_columns(t, columns)),
        k=sql.Identifier(t.key),
        changed=changed,
    )


WRITES = {"upsert": upsert_rows, "patch": patch_rows}
