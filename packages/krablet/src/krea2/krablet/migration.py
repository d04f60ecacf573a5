"""The idempotent migration that creates declared tables on a shard, and the shard's catalog."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import psycopg

from krea2.infra.errors import UserError
from krea2.krablet.schema import Job, Table
from krea2.krablet.sql import ddl


def migrate_shard(conn: psycopg.Connection, tables: Iterable[Table]) -> list[str]:
    """Create or extend ``tables`` on one shard in one transaction; return what changed.

    Safe to run from many processes at once (an advisory lock serialises them) and as often as
    you like. A column whose declared type differs from the shard's is an error, never a rewrite.
    New or changed jobs backfill their queue from the rows that match the predicate.
    """
    changed: list[str] = []
    with conn.transaction():
        conn.execute(ddl.lock_migrations(), (ddl.lock_id("migrate"),))
        conn.execute(ddl.create_catalog())
        for t in tables:
            old = conn.execute(ddl.catalog_spec(), (t.name,)).fetchone()
            old_spec = old[0] if old else None
            existing = (
                dict(conn.execute(ddl.column_types(), (f'"{t.name}"', t.name)).fetchall())
                if table_exists(conn, t.name)
                else {}
            )
            for col, typ in t.all_columns.items():
                have = existing.get(col)
                if have is not None and _norm_type(have) != _norm_type(typ):
                    raise UserError(
                        f"column {t.name}.{col} is {have} on the shard but declared {typ}; "
                        "krablet never rewrites a column: add a new column instead"
                    )
            for stmt in ddl.create_table(t):
                conn.execute(stmt)
            spec = t.to_spec()
            if old_spec != spec:
                old_jobs = {j["name"]: j for j in (old_spec or {}).get("jobs", [])}
                for job in t.jobs:
                    before = old_jobs.get(job.name)
                    if before is None or not job.same_predicate(
                        Job(**{**before, "result": tuple(before["result"])})
                    ):
                        for stmt in ddl.backfill_queue(t, job):
                            conn.execute(stmt)
                        changed.append(f"{t.name}.{job.name}: queue backfilled")
                conn.execute(ddl.save_catalog_spec(), (t.name, json.dumps(spec)))
                changed.append(f"{t.name}: {'created' if old_spec is None else 'migrated'}")
    return changed


def table_exists(conn: psycopg.Connection, table: str) -> bool:
    return conn.execute(ddl.table_exists(), (f'"{table}"',)).fetchone()[0]


_TYPE_ALIASES = {
    "int8": "bigint",
    "int4": "integer",
    "int2": "smallint",
    "bool": "boolean",
    "float8": "double precision",
    "float4": "real",
    "timestamp with time zone": "timestamptz",
}


def _norm_type(typ: str) -> str:
    typ = typ.strip().lower()
    arr = typ.endswith("[]")
    base = typ[:-2] if arr else typ
    return _TYPE_ALIASES.get(base, base) + ("[]" if arr else "")


def load_tables(conn: psycopg.Connection) -> dict[str, Table]:
    """The tables declared on a shard, from its catalog (empty if the shard has none)."""
    if not table_exists(conn, "krablet_catalog"):
        return {}
    rows = conn.execute(ddl.catalog_specs()).fetchall()
    return {spec["name"]: Table.from_spec(spec) for (spec,) in rows}


def schema_fingerprint(conn: psycopg.Connection) -> dict[str, Any]:
    """Everything that defines the shard's krablet schema, for comparing shards and migrations."""
    return {part: conn.execute(q).fetchall() for part, q in ddl.schema_fingerprint().items()}
