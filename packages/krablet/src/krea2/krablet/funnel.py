"""The funnel: per-shard writers that coalesce upserts and patches into batched statements.

Each shard has ``writers_per_shard`` writer threads, each with its own connection and its own
disjoint slice of the keys (by hash), so writers never wait on each other's row locks. Calls
append rows to the owning writer's buffer, where consecutive writes of the same (table,
operation, column set) coalesce by key (last write wins). A writer takes batches of up to
``max_batch`` rows, and up to ``statements_per_commit`` batches share one transaction, so one
WAL flush covers them; batches with the same columns go out as one statement, sorted by key
(concurrent funnels lock rows in the same order): ``INSERT … SELECT FROM unnest(…) ON CONFLICT
DO UPDATE … WHERE … IS DISTINCT FROM …`` (or ``UPDATE … FROM unnest(…)`` for patches), which
skips no-op updates. A refused value refuses its batch only: the others are retried, each in
its own transaction. ``flush()`` returns once everything written before it is committed. With
``durable=False`` the writers commit with ``synchronous_commit=off`` (fire-and-forget, for
idempotent writes). A lost connection (Postgres restart) is retried with backoff; the rows stay
buffered meanwhile.

One process (one GIL) feeds every writer, so the per-row work stays off Python's slow path: a
call checks each distinct column set once and takes each row's values with one ``itemgetter``,
a writer's buffer coalesces with one ``dict.update``, a batch goes out as binary arrays packed
in bulk (:mod:`krea2.krablet.binary`) rather than adapted value by value, and a statement whose
parameters are all packed is one libpq call that releases the GIL for its whole round trip.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import groupby, islice
from operator import itemgetter
from typing import Any

import psycopg
from psycopg import sql

import krea2.krablet.binary as binary
from krea2.infra.errors import UserError
from krea2.krablet.cluster import ShardUnavailable, key_hash
from krea2.krablet.schema import Table, WarehouseView
from krea2.krablet.sql.arrays import column_params, param_type
from krea2.krablet.sql.writes import WRITES, written_columns

log = logging.getLogger(__name__)


class FunnelError(UserError):
    """A batch the database refused (bad value for a column type, …); the data is untouched."""


Run = tuple[tuple[str, ...], list[tuple]]
"""Rows of one column set: the non-key columns (sorted), and each row as (key, *values)."""

_first = itemgetter(0)


@dataclass
class _Group:
    table: str
    op: str
    columns: tuple[str, ...]
    rows: dict[Any, tuple] = field(default_factory=dict)  # key -> (key, *values of columns)
    seq: int = 0


class _ShardWriter(threading.Thread):
    def __init__(self, funnel: Funnel, shard: int, lane: int = 0) -> None:
        super().__init__(name=f"krablet-funnel-{shard}.{lane}", daemon=True)
        self.funnel, self.shard = funnel, shard
        self.cond = threading.Condition()
        self.groups: list[_Group] = []
        self.seq = 0  # rows accepted
        self.done = 0  # highest seq committed (or refused)
        self.errors: list[str] = []
        self.stopping = False
        self.conn: psycopg.Connection | None = None
        self.prepared: dict[int, bytes] = {}  # id of a statement -> its name on self.conn
        self.batches = 0
        self.rows_written = 0
        self.buffered = 0

    def add(self, table: str, op: str, runs: list[Run]) -> None:
        with self.cond:
            while self.buffered >= self.funnel.max_buffered and not self.stopping:
                self.cond.wait(0.5)  # backpressure: the shard is slower than the callers
            for columns, rows in runs:
                last = self.groups[-1] if self.groups else None
                if last is None or (last.table, last.op, last.columns) != (table, op, columns):
                    last = _Group(table, op, columns)
                    self.groups.append(last)
                before = len(last.rows)
                last.rows.update(zip(map(_first, rows), rows, strict=True))  # last write wins
                self.buffered += len(last.rows) - before
                self.seq += len(rows)
                last.seq = self.seq
            self.cond.notify_all()

    def wait_flushed(self, timeout: float | None) -> list[str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            target = self.seq
            while self.done < target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"funnel flush to shard {self.shard} timed out")
                self.cond.wait(left)
            errors, self.errors = self.errors, []
        return errors

    def _take(self) -> list[tuple[_Group, int]]:
        """Up to ``statements_per_commit`` batches from the front of the buffer (empty: stop)."""
        f = self.funnel
        with self.cond:
            while not self.groups and not self.stopping:
                self.cond.wait(0.5)
            if not self.groups:
                return []
            if f.linger_s and len(self.groups) == 1 and len(self.groups[0].rows) < f.max_batch:
                self.cond.wait(f.linger_s)  # let a few more rows coalesce into this batch
            taken: list[tuple[_Group, int]] = []
            while self.groups and len(taken) < f.statements_per_commit:
                group = self.groups[0]
                if len(group.rows) <= f.max_batch:
                    self.groups.pop(0)
                    taken.append((group, group.seq))
                    continue
                keys = list(islice(group.rows, f.max_batch))
                part = _Group(
                    group.table, group.op, group.columns, {k: group.rows.pop(k) for k in keys}
                )
                taken.append((part, 0))  # the rest of the group is still buffered
            self.buffered -= sum(len(g.rows) for g, _ in taken)
            self.cond.notify_all()
            return taken

    def run(self) -> None:
        while True:
            taken = self._take()
            if not taken:
                return
            errors = self._write([g for g, _ in taken])
            with self.cond:
                self.errors.extend(errors)
                self.done = max([self.done, *(seq for _, seq in taken)])
                self.cond.notify_all()

    def _connect(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            options = {} if self.funnel.durable else {"options": "-c synchronous_commit=off"}
            self.conn = self.funnel.wh.cluster.connect(self.shard, **options)
            binary.register(self.conn)
            self.prepared = {}
        return self.conn

    def _prepare(
        self, group: _Group, conn: psycopg.Connection
    ) -> tuple[sql.Composable, dict[str, Any]]:
        t = self.funnel.wh.table(group.table)
        rows = list(map(group.rows.__getitem__, sorted(group.rows)))
        typed = written_columns(t, group.columns)
        params: dict[str, Any] = column_params(typed, rows)
        utf8 = conn.info.encoding == "utf-8"
        for (_, typ), name in zip(typed, list(params), strict=True):
            packed = binary.encode(param_type(typ), params[name], utf8)
            if packed is not None:
                params[name] = packed
        return self.funnel.statement(t, group.op, group.columns), params

    def _write(self, groups: list[_Group]) -> list[str]:
        """Write the batches in one transaction (one statement where they are parts of one
        group); on a data error, each batch in its own transaction, to isolate it."""
        batches = _merge_parts(groups)
        stmts = None
        delay = 0.1
        while True:
            try:
                conn = self._connect()
                if stmts is None:
                    stmts = [self._prepare(g, conn) for g in batches]
                if len(stmts) == 1:
                    if not binary.execute(conn, self.prepared, *stmts[0]):
                        conn.execute(*stmts[0])
                else:
                    with conn.pipeline(), conn.transaction():
                        for stmt, params in stmts:
                            conn.execute(stmt, params)
                self.batches += len(stmts)
                self.rows_written += sum(len(g.rows) for g in batches)
                return []
            except (psycopg.OperationalError, ShardUnavailable) as exc:
                if self.stopping and self.funnel.give_up_on_close:
                    return [f"shard {self.shard} unreachable at close: {exc}"]
                log.warning(
                    "funnel: shard %d unreachable (%s); retrying in %.1fs",
                    self.shard,
                    type(exc).__name__,
                    delay,
                )
                if self.conn is not None:
                    self.conn.close()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except (psycopg.Error, TypeError, ValueError) as exc:
                # the data is wrong, not the connection (also keys of mixed types that do not
                # sort): refuse the batch and keep the writer alive for the others
                if len(groups) > 1:
                    return [e for g in groups for e in self._write([g])]
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                g = groups[0]
                return [f"{g.op} into {g.table} ({len(g.rows)} rows) refused: {msg}"]


def _merge_parts(groups: list[_Group]) -> list[_Group]:
    """Consecutive batches of one column set, as one: they are parts of one buffered group (the
    buffer never holds two neighbouring groups with the same columns), so their keys differ."""
    out: list[_Group] = []
    for (table, op, columns), run in groupby(groups, key=lambda g: (g.table, g.op, g.columns)):
        parts = list(run)
        if len(parts) == 1:
            out.append(parts[0])
            continue
        rows: dict[Any, tuple] = {}
        for part in parts:
            rows.update(part.rows)
        out.append(_Group(table, op, columns, rows, parts[-1].seq))
    return out


class Funnel:
    """Batched writes to every shard of a warehouse. Use as a context manager or call close().

    ``upsert`` inserts rows or updates the given columns of existing ones; ``patch`` updates the
    given columns of existing rows only. Each row is a mapping holding the table's key.

    ``max_batch``: rows per batch (a refused value refuses its batch only);
    ``statements_per_commit``: batches per transaction (one statement where their columns match);
    ``writers_per_shard``: connections per shard, each owning a hash slice of the keys;
    ``max_buffered``: rows a writer may hold before callers block (backpressure);
    ``linger_s``: how long a writer waits for a small batch to grow; ``durable=False``:
    ``synchronous_commit=off`` (a crash may lose the last few hundred ms of acknowledged writes).
    """

    def __init__(
        self,
        wh: WarehouseView,
        durable: bool = True,
        max_batch: int = 1000,
        linger_s: float = 0.0,
        give_up_on_close: bool = False,
        writers_per_shard: int = 4,
        statements_per_commit: int = 8,
        max_buffered: int = 100_000,
    ) -> None:
        self.wh = wh
        self.durable = durable
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.give_up_on_close = give_up_on_close
        self._statements: dict[tuple, sql.Composable] = {}
        if writers_per_shard < 1:
            raise UserError(f"writers_per_shard must be at least 1, got {writers_per_shard}")
        self.lanes = writers_per_shard
        self.statements_per_commit = max(1, statements_per_commit)
        self.max_buffered = max(max_batch, max_buffered)  # rows per writer before callers block
        self._writers = [
            _ShardWriter(self, i, lane)
            for i in range(len(wh.cluster))
            for lane in range(writers_per_shard)
        ]
        for w in self._writers:
            w.start()

    def statement(self, t: Table, op: str, columns: tuple[str, ...]) -> sql.Composable:
        sig = (t.name, op, columns)
        stmt = self._statements.get(sig)
        if stmt is None:
            stmt = self._statements[sig] = WRITES[op](t, columns)
        return stmt

    def _route(self, table: str, op: str, rows: Iterable[Mapping[str, Any]]) -> int:
        t = self.wh.table(table)
        runs: list[Run] = []
        names: set[str] | None = None  # the column names of the current run, checked
        for row in rows:
            if type(row) is not dict and not isinstance(row, Mapping):
                raise UserError(
                    f"{op} into {table}: each row must be a mapping, got {type(row).__name__}"
                )
            if row.keys() != names:  # a new column set: check it once for the whole run
                names = set(row)
                columns = _columns(t, op, names)
                take = itemgetter(t.key, *columns) if columns else lambda r, k=t.key: (r[k],)
                run: list[tuple] = []
                if op != "patch" or columns:  # a patch of no column writes nothing
                    runs.append((columns, run))
            values = take(row)
            if values[0] is None:
                raise UserError(f"{op} into {table}: a row has no key {t.key!r}")
            run.append(values)
        by_writer = _split(runs, len(self._writers), self.lanes) if len(self._writers) > 1 else {}
        for writer, writer_runs in by_writer.items() or [(0, runs)]:
            self._writers[writer].add(table, op, writer_runs)
        return sum(len(r) for _, r in runs)

    def upsert(self, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Queue rows for insert-or-update; returns how many were accepted."""
        return self._route(table, "upsert", rows)

    def patch(self, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Queue column updates of existing rows (unknown keys are ignored)."""
        return self._route(table, "patch", rows)

    def flush(self, timeout: float | None = None) -> None:
        """Block until every write accepted so far is committed; FunnelError for refused batches."""
        errors = [e for w in self._writers for e in w.wait_flushed(timeout)]
        if errors:
            raise FunnelError(
                "; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else "")
            )

    @property
    def batches_written(self) -> int:
        """Statements executed so far (each up to ``statements_per_commit`` batches of rows)."""
        return sum(w.batches for w in self._writers)

    @property
    def rows_written(self) -> int:
        """Rows sent to the shards so far (after coalescing repeated keys)."""
        return sum(w.rows_written for w in self._writers)

    def close(self, flush: bool = True) -> None:
        try:
            if flush:
                self.flush()
        finally:
            for w in self._writers:
                with w.cond:
                    w.stopping = True
                    w.cond.notify_all()
            for w in self._writers:
                w.join(timeout=10)
                if w.conn is not None:
                    w.conn.close()

    def __enter__(self) -> Funnel:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(flush=exc_type is None)


def _columns(t: Table, op: str, names: set[str]) -> tuple[str, ...]:
    """The non-key columns of rows with these names, sorted; UserError naming a bad one."""
    if t.key not in names:
        raise UserError(f"{op} into {t.name}: a row has no key {t.key!r}")
    for col in names:
        if col not in t.all_columns:
            t.check_column(col, f"{op} into {t.name}")
    return tuple(sorted(names - {t.key}))


def _split(runs: list[Run], n_writers: int, lanes: int) -> dict[int, list[Run]]:
    """The runs of each writer. Every key has one writer, so writers never wait on each other's
    row locks and the writes of one key stay in order: its shard and lane come from
    :func:`key_hash`, or on one shard (no placement to keep) from Python's cheaper hash of the
    key's text; either way ``12`` and ``"12"`` share a writer."""
    n_shards = n_writers // lanes
    out: dict[int, list[Run]] = {}
    for columns, rows in runs:
        parts: list[list[tuple]] = [[] for _ in range(n_writers)]
        add = [p.append for p in parts]
        if n_shards == 1:
            for row in rows:
                add[hash(str(row[0])) % lanes](row)
        else:
            for row in rows:
                h = key_hash(row[0])
                add[(h % n_shards) * lanes + (h // n_shards) % lanes](row)
        for writer, part in enumerate(parts):
            if part:
                out.setdefault(writer, []).append((columns, part))
    return out
