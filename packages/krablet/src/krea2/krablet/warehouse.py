"""The warehouse: a cluster plus its declared tables; the entry point of the Python API."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from krea2.infra.errors import UserError
from krea2.krablet.cluster import Cluster, load_cluster
from krea2.krablet.connections import ShardsUnreachable, ShardUnavailable, shard_host
from krea2.krablet.funnel import Funnel
from krea2.krablet.migration import (
    declared_handler,
    load_tables,
    migrate_shard,
    schema_fingerprint,
)
from krea2.krablet.queue import Queue, failed_rows, failing_count, queue_stats
from krea2.krablet.reader import Reader
from krea2.krablet.schema import Table
from krea2.krablet.sql import reads


class Warehouse:
    """A cluster and its tables. ``Warehouse.open(cluster, tables=[...])`` migrates every shard.

    Without ``tables`` the declarations are read from the shards' catalog, so services and
    command-line tools work without importing the code that declared them.
    """

    def __init__(self, cluster: Cluster, tables: Iterable[Table] = ()) -> None:
        self.cluster = cluster
        self.tables: dict[str, Table] = {t.name: t for t in tables}
        self._reader: Reader | None = None

    @classmethod
    def open(
        cls,
        source: str | Path | Sequence[str] | Cluster,
        tables: Iterable[Table] | None = None,
        migrate: bool = True,
    ) -> Warehouse:
        wh = cls(load_cluster(source), tables or ())
        if tables is not None and migrate:
            wh.migrate()
        elif tables is None:
            wh.reload()
        return wh

    def reload(self) -> None:
        """Read table declarations from the first reachable shard's catalog (every shard holds
        the same one; declared tables take precedence). Raises :class:`ShardUnavailable` naming
        every shard when none can be reached."""
        failures: list[ShardUnavailable] = []
        for i in range(len(self.cluster)):
            try:
                with self.cluster.connection(i) as conn:
                    found = load_tables(conn)
            except ShardUnavailable as exc:
                failures.append(exc)
                continue
            for name, t in found.items():
                self.tables.setdefault(name, t)
            return
        if len(failures) == 1:
            raise failures[0]
        raise ShardsUnreachable("no shard is reachable: " + "; ".join(str(f) for f in failures))

    def migrate(self, tables: Iterable[Table] | None = None) -> list[str]:
        """Create or extend the tables on every shard (idempotent). Returns what changed."""
        todo = list(tables) if tables is not None else list(self.tables.values())
        for t in todo:
            self.tables[t.name] = t
        changed = []
        for i in range(len(self.cluster)):
            with self.cluster.connect(i) as conn:
                changed += [
                    f"shard {i}: {c}" for c in migrate_shard(conn, todo, self.cluster.secret)
                ]
        return changed

    def declared_handler(self, table: str, job: str) -> str:
        """Job ``table.job``'s declared handler (``module:function``), read from the first
        reachable shard's catalog and returned only if its signature verifies with the
        cluster's secret: a row changed in the database without the secret never names code
        a worker imports. A UserError naming the fix otherwise."""
        failures: list[ShardUnavailable] = []
        for i in range(len(self.cluster)):
            try:
                with self.cluster.connection(i) as conn:
                    return declared_handler(conn, table, job, self.cluster.secret)
            except ShardUnavailable as exc:
                failures.append(exc)
        raise ShardsUnreachable("no shard is reachable: " + "; ".join(str(f) for f in failures))

    def reset_job(self, table: str, job: str, keys: Iterable[Any]) -> list[Any]:
        """Run ``job`` again on the rows ``keys`` (e.g. their inputs changed): its result
        columns are set to NULL, attempts and errors are cleared, a lease on them is voided
        (its holder's result, computed from the old inputs, is not written), and the rows whose
        claim predicate holds are ready now. Jobs that read this job's results keep theirs:
        reset them too. Returns the keys reset (missing keys are skipped)."""
        q = self.queue(table, job)
        reset: list[Any] = []
        for shard, shard_keys in sorted(self.cluster.split(keys).items()):
            reset += q.reset(shard, shard_keys)
        return reset

    def table(self, name: str) -> Table:
        t = self.tables.get(name)
        if t is None:
            raise UserError(f"no table {name!r} in this warehouse; tables: {sorted(self.tables)}")
        return t

    def queue(self, table: str, job: str, owner: str = "") -> Queue:
        return Queue(self.cluster, self.table(table), job, owner=owner)

    def funnel(self, **kwargs: Any) -> Funnel:
        """An in-process :class:`~krea2.krablet.funnel.Funnel` writing to this warehouse."""
        return Funnel(self, **kwargs)

    def reader(self) -> Reader:
        """The warehouse's in-process :class:`~krea2.krablet.reader.Reader` (one, shared).

        :class:`~krea2.krablet.service.RpcClient` has the same methods over HTTP.
        """
        if self._reader is None:
            self._reader = Reader(self)
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader: Reader | None = None
        self.cluster.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- status -----------------------------------------------------------------------------
    def status(
        self, cap: int = 100_000, fingerprints: bool = True, errors: int = 5
    ) -> dict[str, Any]:
        """Per shard: reachability, row counts (capped), queue backlogs, each job's ``failing``
        rows (failed, not done; capped) and ``errors`` (up to ``errors`` of them: key,
        attempts, last_error, next_try_at); ``failing``: per ``TABLE.JOB``, the failing rows
        of the reachable shards together; and whether the schema is identical on the reachable
        shards (``schema_consistent``, None if none is reachable) with the shards that could
        not be checked (``unreachable``)."""
        shards = []
        prints: list[dict] = []
        for i in range(len(self.cluster)):
            entry: dict[str, Any] = {"shard": i, "ok": True, "tables": {}}
            try:
                with self.cluster.connection(i) as conn:
                    if fingerprints:
                        prints.append(schema_fingerprint(conn))
                    for name, t in sorted(self.tables.items()):
                        exact = conn.execute(reads.capped_row_count(name), (cap,)).fetchone()[0]
                        rows = exact if exact < cap else _row_estimate(conn, name)
                        entry["tables"][name] = {
                            "rows": rows,
                            "jobs": {
                                j.name: {
                                    **queue_stats(conn, t.queue_table(j.name), cap),
                                    "failing": failing_count(conn, t.queue_table(j.name), cap),
                                    "errors": failed_rows(conn, t.queue_table(j.name), errors),
                                }
                                for j in t.jobs
                            },
                        }
            except Exception as exc:  # one dead shard must not hide the others
                entry["ok"] = False
                entry["host"] = shard_host(self.cluster.shards[i])
                entry["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            shards.append(entry)
        same = all(f == prints[0] for f in prints) if prints else None
        down = [e["shard"] for e in shards if not e["ok"]]
        failing = {
            f"{name}.{j.name}": sum(
                e["tables"][name]["jobs"][j.name]["failing"] for e in shards if e["ok"]
            )
            for name, t in sorted(self.tables.items())
            for j in t.jobs
        }
        return {
            "shards": shards,
            "failing": failing,
            "schema_consistent": same,
            "unreachable": down,
        }


def _row_estimate(conn: psycopg.Connection, table: str) -> int | None:
    """The planner's row estimate (0 if never analysed), None if the table is missing."""
    est = conn.execute(reads.row_estimate(), (f'"{table}"',)).fetchone()
    return max(int(est[0]), 0) if est else None
