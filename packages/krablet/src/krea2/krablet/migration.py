"""The idempotent migration that creates declared tables on a shard, and the shard's catalog."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import psycopg

from krea2.infra.errors import UserError
from krea2.krablet.schema import Job, Table
from krea2.krablet.signing import handler_signature, usable_secret, verify_handler
from krea2.krablet.sql import ddl


def migrate_shard(
    conn: psycopg.Connection, tables: Iterable[Table], secret: str | None = None
) -> list[str]:
    """Create or extend ``tables`` on one shard in one transaction; return what changed.

    Safe to run from many processes at once (an advisory lock serialises them) and as often as
    you like. A column whose declared type differs from the shard's is an error, never a rewrite.
    New or changed jobs backfill their queue from the rows that match the predicate. Declared
    handlers are stored signed with ``secret`` (the cluster's), so a worker imports one only if
    it was declared by someone holding the secret (:func:`declared_handler`).
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
            spec = catalog_entry(t, secret)
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


def catalog_entry(t: Table, secret: str | None) -> dict[str, Any]:
    """``t``'s catalog spec, with each declared handler's signature under ``signed_handlers``
    when ``secret`` can sign (``Table.from_spec`` ignores that key)."""
    spec = t.to_spec()
    if usable_secret(secret):
        signed = {
            j.name: handler_signature(secret or "", t.name, j.name, j.handler)
            for j in t.jobs
            if j.handler
        }
        if signed:
            spec["signed_handlers"] = signed
    return spec


def declared_handler(conn: psycopg.Connection, table: str, job: str, secret: str | None) -> str:
    """Job ``table.job``'s handler spec as this shard's catalog holds it, once its signature
    verifies with ``secret``; a UserError naming the fix when the job declares no handler or
    the entry is not signed with the cluster's secret (``signing.verify_handler``)."""
    row = None
    if table_exists(conn, "krablet_catalog"):
        row = conn.execute(ddl.catalog_spec(), (table,)).fetchone()
    spec = row[0] if row is not None else None
    if not isinstance(spec, dict):
        raise UserError(f"no table {table!r} is declared on this cluster")
    jobs = spec.get("jobs") if isinstance(spec.get("jobs"), list) else []
    found = next((j for j in jobs if isinstance(j, dict) and j.get("name") == job), None)
    if found is None:
        raise UserError(f"table {table!r} has no job {job!r}")
    handler = found.get("handler")
    if not handler:
        raise UserError(f"job {table}.{job} declares no handler; pass --handler module:function")
    if not isinstance(handler, str):
        raise UserError(f"job {table}.{job}'s declared handler is not a string: {handler!r}")
    signed = spec.get("signed_handlers")
    signature = signed.get(job) if isinstance(signed, dict) else None
    verify_handler(secret, table, job, handler, signature)
    return handler


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
