"""Schema statements: tables, their job queues and enqueue triggers, the catalog, backfills.

Every statement here is idempotent, so a migration can run any number of times from any
number of processes (:func:`lock_migrations` serialises them on a shard).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from psycopg import sql

from krea2.krablet.sql.queue import job_predicate

if TYPE_CHECKING:
    from krea2.krablet.schema import Job, Table

# Queue tables churn (every claim rewrites a row): leave room for HOT updates, vacuum early.
QUEUE_STORAGE = sql.SQL(
    "fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,"
    " autovacuum_vacuum_cost_delay = 0, autovacuum_vacuum_cost_limit = 10000,"
    " autovacuum_analyze_scale_factor = 0.02"
)


def create_database(name: str) -> sql.Composable:
    """A new, empty database on the server (tests make one per test, so none sees another's
    tables)."""
    return sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))


def create_catalog() -> sql.Composable:
    """The per-shard catalog of declared tables (name → spec), read by tools and services."""
    return sql.SQL("""
CREATE TABLE IF NOT EXISTS krablet_catalog (
    name text PRIMARY KEY,
    spec jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)""")


def catalog_spec() -> sql.Composable:
    """The spec of table ``%s`` from the catalog (no row if undeclared)."""
    return sql.SQL("SELECT spec FROM krablet_catalog WHERE name = %s")


def catalog_specs() -> sql.Composable:
    """Every spec in the catalog, by table name."""
    return sql.SQL("SELECT spec FROM krablet_catalog ORDER BY name")


def save_catalog_spec() -> sql.Composable:
    """Insert or replace the spec (``%s`` json) of table ``%s``."""
    return sql.SQL(
        "INSERT INTO krablet_catalog (name, spec) VALUES (%s, %s) "
        "ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, updated_at = now()"
    )


def lock_id(name: str) -> int:
    """A stable signed 64-bit advisory-lock id for ``name``."""
    return int.from_bytes(
        hashlib.blake2b(f"krablet:{name}".encode(), digest_size=8).digest(), "big", signed=True
    )


def lock_migrations() -> sql.Composable:
    """Take the migration lock (``%s``: :func:`lock_id`) until the transaction ends."""
    return sql.SQL("SELECT pg_advisory_xact_lock(%s)")


def table_exists() -> sql.Composable:
    """Whether the table ``%s`` (its quoted name) exists."""
    return sql.SQL("SELECT to_regclass(%s) IS NOT NULL")


def column_types() -> sql.Composable:
    """(column, type as ``format_type`` prints it) of table ``%s`` (quoted) named ``%s``."""
    return sql.SQL(
        "SELECT column_name, format_type(a.atttypid, a.atttypmod) "
        "FROM information_schema.columns c "
        "JOIN pg_attribute a ON a.attrelid = %s::regclass "
        "AND a.attname = c.column_name "
        "WHERE c.table_name = %s"
    )


def create_table(t: Table) -> list[sql.Composable]:
    """Statements that create or extend ``t``: columns, indexes, job queues, triggers."""
    name = sql.Identifier(t.name)
    stmts: list[sql.Composable] = [
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} {} PRIMARY KEY)").format(
            name, sql.Identifier(t.key), sql.SQL(t.key_type)
        )
    ]
    for col, typ in t.columns.items():
        stmts.append(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                name, sql.Identifier(col), sql.SQL(typ)
            )
        )
    for col in t.indexes:
        stmts.append(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                sql.Identifier(f"{t.name}__{col}_idx"), name, sql.Identifier(col)
            )
        )
    for job in t.jobs:
        stmts += create_queue(t, job)
    return stmts + create_enqueue_triggers(t)


def create_queue(t: Table, job: Job) -> list[sql.Composable]:
    """The job's narrow queue table and its ready index (``next_try_at`` order)."""
    q = t.queue_table(job.name)
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " key {} PRIMARY KEY,"
            " next_try_at timestamptz NOT NULL DEFAULT now(),"
            " attempts integer NOT NULL DEFAULT 0,"
            " owner text, token bigint, last_error text, last_tried_at timestamptz"
            ") WITH ({})"
        ).format(sql.Identifier(q), sql.SQL(t.key_type), QUEUE_STORAGE),
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (next_try_at)").format(
            sql.Identifier(f"{q}_ready"), sql.Identifier(q)
        ),
    ]


def create_enqueue_triggers(t: Table) -> list[sql.Composable]:
    """Statement-level triggers that enqueue rows whose job predicate became true."""
    fn = sql.Identifier(f"_kq_enqueue_{t.name}")
    # the function body is a string literal, so its statements are rendered to text here
    body = (
        "".join(
            sql.SQL(
                "INSERT INTO {} (key) SELECT {} FROM new_rows "
                "WHERE {} ON CONFLICT (key) DO NOTHING;\n"
            )
            .format(sql.Identifier(t.queue_table(j.name)), sql.Identifier(t.key), job_predicate(j))
            .as_string(None)
            for j in t.jobs
        )
        or "NULL;\n"
    )
    stmts: list[sql.Composable] = [
        sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}").format(
            fn, sql.Literal(f"BEGIN\n{body}RETURN NULL;\nEND")
        )
    ]
    for event in ("insert", "update"):
        trig = sql.Identifier(f"_kq_{t.name}_{event}")
        if t.jobs:
            stmts.append(
                sql.SQL(
                    "CREATE OR REPLACE TRIGGER {} AFTER {} ON {} REFERENCING NEW TABLE AS new_rows "
                    "FOR EACH STATEMENT EXECUTE FUNCTION {}()"
                ).format(trig, sql.SQL(event.upper()), sql.Identifier(t.name), fn)
            )
        else:
            stmts.append(
                sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trig, sql.Identifier(t.name))
            )
    return stmts


def backfill_queue(t: Table, job: Job) -> list[sql.Composable]:
    """Make the job's queue hold exactly the rows whose predicate is true (two statements)."""
    q, name, k = (sql.Identifier(n) for n in (t.queue_table(job.name), t.name, t.key))
    pred = job_predicate(job)
    return [
        sql.SQL(
            "DELETE FROM {q} WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE {t}.{k} = {q}.key AND {p})"
        ).format(q=q, t=name, k=k, p=pred),
        sql.SQL(
            "INSERT INTO {q} (key) SELECT {k} FROM {t} WHERE {p} ON CONFLICT (key) DO NOTHING"
        ).format(q=q, t=name, k=k, p=pred),
    ]


def schema_fingerprint() -> dict[str, sql.Composable]:
    """The queries whose answers define a shard's krablet schema, by part."""
    return {
        # column order is not part of the contract (ADD COLUMN appends): sorted by name
        "columns": sql.SQL(
            "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '') "
            "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2"
        ),
        "indexes": sql.SQL(
            "SELECT tablename, indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = 'public' ORDER BY 1, 2"
        ),
        "triggers": sql.SQL(
            "SELECT event_object_table, trigger_name, event_manipulation, action_statement "
            "FROM information_schema.triggers ORDER BY 1, 2, 3"
        ),
        "functions": sql.SQL(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n "
            "ON n.oid = p.pronamespace WHERE n.nspname = 'public' ORDER BY 1"
        ),
        "storage": sql.SQL(
            "SELECT relname, coalesce(reloptions::text, '') FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND relkind = 'r' ORDER BY 1"
        ),
    }
