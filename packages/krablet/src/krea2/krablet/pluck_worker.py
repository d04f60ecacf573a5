"""pluck's worker side: the handler that runs a map's function over a range, and its Worker.

Ranges are rows of :data:`~krea2.krablet.pluck.RANGES`' ``run`` job, so :class:`PluckWorker` is
an ordinary :class:`~krea2.krablet.worker.Worker` (claims, heartbeats, jittered backoff,
release on stop) whose handler, :class:`RangeRunner`, verifies each map's signature before it
unpickles anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
from psycopg.rows import dict_row

from krea2.infra.errors import UserError
from krea2.krablet.pluck import MAP_COLUMNS, MAPS, RANGES, RUN, map_signature, require_secret
from krea2.krablet.schema import Table
from krea2.krablet.signing import signature_matches
from krea2.krablet.sql import pluck as pluck_sql
from krea2.krablet.sql import reads
from krea2.krablet.sql.arrays import column_params
from krea2.krablet.sql.writes import patch_rows, written_columns
from krea2.krablet.warehouse import Warehouse
from krea2.krablet.worker import Worker


class PluckRefused(PermissionError):
    """A map whose signature does not verify with this cluster's secret; it is never run."""


@dataclass(frozen=True)
class _Map:
    table: str
    where: str | None
    batch_size: int
    fn: Callable[[list[dict]], Any]


class RangeRunner:
    """The handler of the ranges' ``run`` job: ``fn`` of the range's (verified) map over each
    page of the range's rows, results patched back; returns ``{"rows_done": n}`` per range."""

    def __init__(self, wh: Warehouse) -> None:
        self.wh = wh
        self.secret = require_secret(wh)
        self.stopping = threading.Event()  # set: stop between pages, the range is retried
        self.refused = 0
        self._maps: dict[str, _Map] = {}
        self._lock = threading.Lock()

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        out: list[dict | Exception] = []
        for r in rows:
            try:
                out.append({"rows_done": self.run_range(r)})
            except Exception as exc:  # this range fails alone, and backs off
                out.append(exc)
        return out

    def _map(self, map_id: str, shard: int) -> _Map:
        """The map's callable, unpickled once per worker, only if its signature verifies."""
        with self._lock:
            found = self._maps.get(map_id)
            if found is not None:
                return found
            with (
                self.wh.cluster.connection(shard) as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                cur.execute(reads.get_rows(MAPS, MAP_COLUMNS), ([map_id],))
                m = cur.fetchone()
            if m is None:
                raise UserError(f"pluck map {map_id!r} is not on shard {shard}")
            blob = bytes(m["fn"])
            expected = map_signature(
                self.secret, map_id, m["table_name"], m["where_sql"], m["batch_size"], blob
            )
            if not signature_matches(expected, m["signature"]):
                self.refused += 1
                raise PluckRefused(
                    "refused: the job's signature does not match this cluster's secret "
                    "(unsigned or forged pluck job); it was not run"
                )
            fn = cloudpickle.loads(blob)
            if isinstance(fn, type):
                fn = fn()
                if hasattr(fn, "setup"):
                    fn.setup()
            found = self._maps[map_id] = _Map(m["table_name"], m["where_sql"], m["batch_size"], fn)
            return found

    def run_range(self, r: dict) -> int:
        """Run the map over range ``r`` (map_id, shard, lo, hi); return the rows it saw."""
        m = self._map(r["map_id"], r["shard"])
        t = self.wh.table(m.table)
        lo, hi = r["lo"] is not None, r["hi"] is not None
        first_page = pluck_sql.range_page(t, m.where, lo, hi, after=False)
        next_page = pluck_sql.range_page(t, m.where, lo, hi, after=True)
        after, total = None, 0
        while not self.stopping.is_set():
            with (
                self.wh.cluster.connection(r["shard"]) as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                cur.execute(
                    first_page if after is None else next_page,
                    {"lo": r["lo"], "hi": r["hi"], "after": after, "n": m.batch_size},
                )
                rows = cur.fetchall()
            if not rows:
                break
            out = m.fn([dict(row) for row in rows])
            if out is not None:
                self._patch(r["shard"], t, rows, list(out))
            total += len(rows)
            after = str(rows[-1][t.key])
            if len(rows) < m.batch_size:
                break
        if self.stopping.is_set():
            raise InterruptedError("worker stopping; the range will be retried")
        return total

    def _patch(self, shard: int, t: Table, rows: list[dict], out: list) -> None:
        if len(out) != len(rows):
            raise ValueError(f"pluck function returned {len(out)} results for {len(rows)} rows")
        groups: dict[tuple[str, ...], list[tuple]] = {}
        for row, res in zip(rows, out, strict=True):
            if not res:
                continue
            cols = tuple(sorted(res))
            for c in cols:
                t.check_column(c, "pluck result")
            groups.setdefault(cols, []).append((row[t.key], *(res[c] for c in cols)))
        with self.wh.cluster.connection(shard) as conn:
            for cols, vals in groups.items():
                conn.execute(
                    patch_rows(t, cols), column_params(written_columns(t, cols), sorted(vals))
                )


class PluckWorker(Worker):
    """A :class:`Worker` of the ranges' ``run`` job: one range per claim, any map's ranges."""

    def __init__(
        self,
        wh: Warehouse,
        concurrency: int = 1,
        poll_s: float = 0.2,
        lease_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.runner = RangeRunner(wh)
        wh.migrate([MAPS, RANGES])
        super().__init__(
            wh,
            RANGES.name,
            RUN.name,
            self.runner,
            batch_size=1,
            concurrency=concurrency,
            lease_s=lease_s,
            poll_s=poll_s,
            **kwargs,
        )

    def stop(self, signum: int | None = None) -> None:
        self.runner.stopping.set()
        super().stop(signum)


__all__ = ["PluckRefused", "PluckWorker", "RangeRunner"]
