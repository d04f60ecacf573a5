"""Declarative tables and jobs, and the idempotent migration that creates them on every shard.

A :class:`Table` is a primary key, typed columns, secondary indexes and :class:`Job` s. A job is a
result column (its *done marker*, NULL until the job has run) plus a claim predicate over the
row, which may read other jobs' results. Each job's queue state lives in its own narrow table
``_kq_<table>_<job>`` (key, next_try_at, attempts, owner, token, last_error), kept in step with
the predicate by statement-level triggers on the wide table, so claims never rewrite wide rows.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import psycopg
from psycopg import sql

from krea2.infra.errors import UserError

IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
TYPES = {
    "text",
    "bigint",
    "integer",
    "smallint",
    "boolean",
    "double precision",
    "real",
    "jsonb",
    "bytea",
    "timestamptz",
    "date",
    "text[]",
    "real[]",
    "bigint[]",
    "integer[]",
    "double precision[]",
}
KEY_TYPES = {"text", "bigint", "integer"}
RESERVED = {"krablet_catalog", "krablet_pluck_jobs", "krablet_pluck_tasks"}


def check_ident(name: str, what: str) -> str:
    if not isinstance(name, str) or not IDENT.match(name):
        raise UserError(
            f"{what} {name!r} is not a valid name: use lower-case letters, digits and '_' "
            "(at most 40 characters, not starting with a digit)"
        )
    return name


@dataclass(frozen=True)
class Job:
    """A unit of work over a table's rows.

    ``result``: the column(s) the job writes; the first is the done marker (NULL = to do).
    ``where``: extra claim predicate in SQL over the table's columns, e.g. ``contains_text = FALSE``
    (this is how a job depends on another job's result). ``inputs``: columns handed to the
    handler (default: all). ``lease_s``: how long a claim lasts without a heartbeat.
    Failures retry after ``backoff_s * 2**(attempts-1)`` (capped at ``max_backoff_s``, jittered).
    """

    name: str
    result: str | Sequence[str]
    where: str | None = None
    inputs: Sequence[str] | None = None
    lease_s: float = 60.0
    backoff_s: float = 5.0
    max_backoff_s: float = 3600.0
    handler: str | None = None  # "module:function", used by `krea2 krablet worker`

    @property
    def results(self) -> list[str]:
        return [self.result] if isinstance(self.result, str) else list(self.result)

    @property
    def done_column(self) -> str:
        return self.results[0]

    def predicate(self) -> str:
        """The full claim predicate: done marker still NULL, and the extra ``where``."""
        base = f'"{self.done_column}" IS NULL'
        return f"{base} AND ({self.where})" if self.where else base


@dataclass(frozen=True)
class Table:
    """A warehouse table, created identically on every shard; rows are placed by hash of ``key``."""

    name: str
    columns: dict[str, str]
    key: str = "key"
    key_type: str = "text"
    jobs: Sequence[Job] = field(default_factory=tuple)
    indexes: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_ident(self.name, "table")
        if self.name in RESERVED:
            raise UserError(f"table name {self.name!r} is reserved by krablet")
        check_ident(self.key, "key column")
        if self.key_type not in KEY_TYPES:
            raise UserError(
                f"key_type {self.key_type!r} of table {self.name!r}: use one of {sorted(KEY_TYPES)}"
            )
        for col, typ in self.columns.items():
            check_ident(col, f"column of {self.name!r}")
            if col == self.key:
                raise UserError(
                    f"column {col!r} of {self.name!r} is the key; do not list it in columns"
                )
            if typ not in TYPES:
                raise UserError(
                    f"column {self.name}.{col} has type {typ!r}; use one of {sorted(TYPES)}"
                )
        names = set()
        for job in self.jobs:
            check_ident(job.name, f"job of {self.name!r}")
            if len(self.queue_table(job.name)) > 63:
                raise UserError(f"job {self.name}.{job.name}: table+job name too long")
            if job.name in names:
                raise UserError(f"job {job.name!r} is declared twice on {self.name!r}")
            names.add(job.name)
            for col in [*job.results, *(job.inputs or ())]:
                self.check_column(col, f"job {job.name!r}")
        for col in self.indexes:
            self.check_column(col, "index")

    # -- lookups -------------------------------------------------------------------------
    @cached_property
    def all_columns(self) -> dict[str, str]:
        """The key and every column, name → type (treat as read-only)."""
        return {self.key: self.key_type, **self.columns}

    def check_column(self, col: str, what: str = "request") -> str:
        if col not in self.all_columns:
            raise UserError(
                f"{what}: table {self.name!r} has no column {col!r}; "
                f"columns: {sorted(self.all_columns)}"
            )
        return col

    def job(self, name: str) -> Job:
        for job in self.jobs:
            if job.name == name:
                return job
        raise UserError(
            f"table {self.name!r} has no job {name!r}; jobs: {[j.name for j in self.jobs]}"
        )

    def queue_table(self, job: str) -> str:
        return f"_kq_{self.name}_{job}"

    # -- (de)serialisation for the catalog ------------------------------------------------
    def to_spec(self) -> dict[str, Any]:
        spec = asdict(self)
        spec["jobs"] = [
            asdict(j) | {"result": j.results, "inputs": list(j.inputs) if j.inputs else None}
            for j in self.jobs
        ]
        spec["indexes"] = list(self.indexes)
        return spec

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Table:
        jobs = tuple(Job(**{**j, "result": tuple(j["result"])}) for j in spec.get("jobs", ()))
        return cls(
            name=spec["name"],
            columns=dict(spec["columns"]),
            key=spec["key"],
            key_type=spec["key_type"],
            jobs=jobs,
            indexes=tuple(spec.get("indexes", ())),
        )


# ---------------------------------------------------------------------------------------------
# DDL
# ---------------------------------------------------------------------------------------------

CATALOG_DDL = """
CREATE TABLE IF NOT EXISTS krablet_catalog (
    name text PRIMARY KEY,
    spec jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""

QUEUE_STORAGE = (
    "fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,"
    " autovacuum_vacuum_cost_delay = 0, autovacuum_vacuum_cost_limit = 10000,"
    " autovacuum_analyze_scale_factor = 0.02"
)


def _q(name: str) -> sql.Identifier:
    return sql.Identifier(name)


def table_ddl(t: Table) -> list[sql.Composable]:
    """Statements that create or extend ``t`` (each one idempotent)."""
    stmts: list[sql.Composable] = [
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} {} PRIMARY KEY)").format(
            _q(t.name), _q(t.key), sql.SQL(t.key_type)
        )
    ]
    for col, typ in t.columns.items():
        stmts.append(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                _q(t.name), _q(col), sql.SQL(typ)
            )
        )
    for col in t.indexes:
        stmts.append(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                _q(f"{t.name}__{col}_idx"), _q(t.name), _q(col)
            )
        )
    for job in t.jobs:
        q = t.queue_table(job.name)
        stmts.append(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " key {} PRIMARY KEY,"
                " next_try_at timestamptz NOT NULL DEFAULT now(),"
                " attempts integer NOT NULL DEFAULT 0,"
                " owner text, token bigint, last_error text, last_tried_at timestamptz"
                ") WITH ({})"
            ).format(_q(q), sql.SQL(t.key_type), sql.SQL(QUEUE_STORAGE))
        )
        stmts.append(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (next_try_at)").format(
                _q(f"{q}_ready"), _q(q)
            )
        )
    stmts.extend(trigger_ddl(t))
    return stmts


def trigger_ddl(t: Table) -> list[sql.Composable]:
    """Statement-level triggers that enqueue rows whose job predicate became true."""
    fn = f"_kq_enqueue_{t.name}"
    body = (
        "".join(
            f'INSERT INTO "{t.queue_table(j.name)}" (key) SELECT "{t.key}" FROM new_rows '
            f"WHERE {j.predicate()} ON CONFLICT (key) DO NOTHING;\n"
            for j in t.jobs
        )
        or "NULL;\n"
    )
    stmts: list[sql.Composable] = [
        sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}").format(
            _q(fn), sql.Literal(f"BEGIN\n{body}RETURN NULL;\nEND")
        )
    ]
    for event in ("insert", "update"):
        trig = f"_kq_{t.name}_{event}"
        if t.jobs:
            stmts.append(
                sql.SQL(
                    "CREATE OR REPLACE TRIGGER {} AFTER {} ON {} REFERENCING NEW TABLE AS new_rows "
                    "FOR EACH STATEMENT EXECUTE FUNCTION {}()"
                ).format(_q(trig), sql.SQL(event.upper()), _q(t.name), _q(fn))
            )
        else:
            stmts.append(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(_q(trig), _q(t.name)))
    return stmts


def _lock_id(name: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(f"krablet:{name}".encode(), digest_size=8).digest(), "big", signed=True
    )


def migrate_shard(conn: psycopg.Connection, tables: Iterable[Table]) -> list[str]:
    """Create or extend ``tables`` on one shard in one transaction; return what changed.

    Safe to run from many processes at once (an advisory lock serialises them) and as often as
    you like. A column whose declared type differs from the shard's is an error, never a rewrite.
    New or changed jobs backfill their queue from the rows that match the predicate.
    """
    changed: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_id("migrate"),))
        conn.execute(CATALOG_DDL)
        for t in tables:
            old = conn.execute(
                "SELECT spec FROM krablet_catalog WHERE name = %s", (t.name,)
            ).fetchone()
            old_spec = old[0] if old else None
            existing = (
                dict(
                    conn.execute(
                        "SELECT column_name, format_type(a.atttypid, a.atttypmod) "
                        "FROM information_schema.columns c "
                        "JOIN pg_attribute a ON a.attrelid = %s::regclass "
                        "AND a.attname = c.column_name "
                        "WHERE c.table_name = %s",
                        (f'"{t.name}"', t.name),
                    ).fetchall()
                )
                if _exists(conn, t.name)
                else {}
            )
            for col, typ in t.all_columns.items():
                have = existing.get(col)
                if have is not None and _norm_type(have) != _norm_type(typ):
                    raise UserError(
                        f"column {t.name}.{col} is {have} on the shard but declared {typ}; "
                        "krablet never rewrites a column: add a new column instead"
                    )
            for stmt in table_ddl(t):
                conn.execute(stmt)
            spec = t.to_spec()
            if old_spec != spec:
                old_jobs = {j["name"]: j for j in (old_spec or {}).get("jobs", [])}
                for job in t.jobs:
                    before = old_jobs.get(job.name)
                    if (
                        before is None
                        or Job(**{**before, "result": tuple(before["result"])}).predicate()
                        != job.predicate()
                    ):
                        backfill_queue(conn, t, job)
                        changed.append(f"{t.name}.{job.name}: queue backfilled")
                conn.execute(
                    "INSERT INTO krablet_catalog (name, spec) VALUES (%s, %s) "
                    "ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, updated_at = now()",
                    (t.name, json.dumps(spec)),
                )
                changed.append(f"{t.name}: {'created' if old_spec is None else 'migrated'}")
    return changed


def backfill_queue(conn: psycopg.Connection, t: Table, job: Job) -> None:
    """Make the job's queue hold exactly the rows whose predicate is true."""
    q = _q(t.queue_table(job.name))
    conn.execute(
        sql.SQL(
            "DELETE FROM {q} WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE {t}.{k} = {q}.key AND {p})"
        ).format(q=q, t=_q(t.name), k=_q(t.key), p=sql.SQL(job.predicate()))
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {q} (key) SELECT {k} FROM {t} WHERE {p} ON CONFLICT (key) DO NOTHING"
        ).format(q=q, t=_q(t.name), k=_q(t.key), p=sql.SQL(job.predicate()))
    )


def _exists(conn: psycopg.Connection, table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{table}"',)).fetchone()[0]


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
    if not _exists(conn, "krablet_catalog"):
        return {}
    rows = conn.execute("SELECT spec FROM krablet_catalog ORDER BY name").fetchall()
    return {spec["name"]: Table.from_spec(spec) for (spec,) in rows}


def schema_fingerprint(conn: psycopg.Connection) -> dict[str, Any]:
    """Everything that defines the shard's krablet schema, for comparing shards and migrations."""
    cols = conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '') "
        "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2"
    ).fetchall()
    idx = conn.execute(
        "SELECT tablename, indexname, indexdef FROM pg_indexes "
        "WHERE schemaname = 'public' ORDER BY 1, 2"
    ).fetchall()
    trg = conn.execute(
        "SELECT event_object_table, trigger_name, event_manipulation, action_statement "
        "FROM information_schema.triggers ORDER BY 1, 2, 3"
    ).fetchall()
    fns = conn.execute(
        "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'public' ORDER BY 1"
    ).fetchall()
    opts = conn.execute(
        "SELECT relname, coalesce(reloptions::text, '') FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND relkind = 'r' ORDER BY 1"
    ).fetchall()
    # Column order is not part of the contract (ADD COLUMN appends), so columns are sorted by name.
    return {"columns": cols, "indexes": idx, "triggers": trg, "functions": fns, "storage": opts}
