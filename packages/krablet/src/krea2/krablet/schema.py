"""Declarative tables and jobs: what a table holds and which jobs run over its rows.

A :class:`Table` is a primary key, typed columns, secondary indexes and :class:`Job` s. A job is a
result column (its *done marker*, NULL until the job has run) plus a claim predicate over the
row, which may read other jobs' results. Each job's queue state lives in its own narrow table
``_kq_<table>_<job>`` (key, next_try_at, attempts, owner, token, last_error), kept in step with
the predicate by statement-level triggers on the wide table, so claims never rewrite wide rows.
:mod:`krea2.krablet.migration` creates them on every shard.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.krablet.cluster import Cluster

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
RESERVED = {"krablet_catalog", "krablet_pluck_maps", "krablet_pluck_ranges"}  # krablet's own


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
    # "module:function" run by `krea2 krablet worker --job` when no --handler is given; stored
    # signed with the cluster secret, and imported only if that signature verifies
    handler: str | None = None

    @property
    def results(self) -> list[str]:
        return [self.result] if isinstance(self.result, str) else list(self.result)

    @property
    def done_column(self) -> str:
        return self.results[0]

    def same_predicate(self, other: Job) -> bool:
        """Whether both jobs claim the same rows (same done marker and extra ``where``)."""
        return (self.done_column, self.where or None) == (other.done_column, other.where or None)


@dataclass(frozen=True)
class Table:
    """A warehouse table, created identically on every shard; rows are placed by hash of ``key``.

    ``internal`` marks krablet's own tables (pluck's), the only ones that may take a reserved name.
    """

    name: str
    columns: dict[str, str]
    key: str = "key"
    key_type: str = "text"
    jobs: Sequence[Job] = field(default_factory=tuple)
    indexes: Sequence[str] = field(default_factory=tuple)
    internal: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        check_ident(self.name, "table")
        if self.name in RESERVED and not self.internal:
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
        if not self.internal:
            del spec["internal"]  # user tables' specs stay as they were before the flag
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
            internal=bool(spec.get("internal", False)),
        )


class WarehouseView(Protocol):
    """What the funnel and the reader need of a warehouse: its cluster and its tables by name."""

    cluster: Cluster

    def table(self, name: str) -> Table: ...
