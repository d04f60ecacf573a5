"""Workers: claim batches from the shards with the most backlog, run a handler, write results.

A handler takes a list of rows (dicts with the key and the job's inputs) and returns one result
per row, in order: a dict of result columns, or an Exception instance to fail that row alone.
If it raises, the whole batch fails. A class with an optional ``setup()`` method and a
``__call__(rows)`` is instantiated once per slot (stateful workers: load a model once).

Shards are chosen by two random choices weighted by a cached backlog estimate, so 1 or 1,000
workers spread over the shards without coordination. Leases are extended by a heartbeat
thread every ``lease_s / 3``. ``stop()`` (SIGTERM/SIGINT under ``run``) stops claiming, lets
running batches finish for up to ``grace_s`` and releases whatever is still unfinished. Lost
connections (a Postgres restart) are retried with backoff, never fatal.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import random
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import psycopg_pool

import krea2.krablet.metrics as metrics
from krea2.infra.errors import UserError
from krea2.krablet.queue import Claim, Queue
from krea2.krablet.warehouse import Warehouse

log = logging.getLogger(__name__)
RETRYABLE = (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg.InterfaceError)


def resolve_handler(spec: str) -> Any:
    """Import ``module:attr`` or ``path/to/file.py:attr``."""
    if ":" not in spec:
        raise UserError(f"handler {spec!r} must look like 'package.module:function'")
    mod_name, _, attr = spec.rpartition(":")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            if loader_spec is None or loader_spec.loader is None or not path.exists():
                raise ImportError(f"no such file {path}")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load handler {spec!r}: {exc}") from None


def instantiate(handler: Any) -> Callable[[list[dict]], list]:
    """A callable for one slot: classes are instantiated and set up once."""
    if isinstance(handler, type):
        obj = handler()
        if hasattr(obj, "setup"):
            obj.setup()
        return obj
    return handler


@dataclass
class WorkerStats:
    """What one :meth:`Worker.run` did (counts are rows, except ``batches``).

    ``interrupted``: :meth:`Worker.stop` (or SIGTERM/SIGINT) ended the run while the job still
    had ready or leased rows on a reachable shard; ``stopped_by`` is that signal's number
    (None for a plain ``stop()``). ``unreachable_shards``: shard indexes that could not be
    reached when the run ended (their rows were not worked on); ``unreachable`` describes each
    as ``shard N (host …)``, never with a password.
    """

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    batches: int = 0
    released: int = 0
    errors: list[str] = field(default_factory=list)
    interrupted: bool = False
    stopped_by: int | None = None
    unreachable_shards: list[int] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        """True when the run neither was interrupted nor left shards unreached."""
        return not self.interrupted and not self.unreachable_shards


class Worker:
    """Runs one job's handler over the cluster until stopped (or until the queue is empty)."""

    def __init__(
        self,
        wh: Warehouse,
        table: str,
        job: str,
        handler: Any,
        batch_size: int = 32,
        concurrency: int = 1,
        lease_s: float | None = None,
        poll_s: float = 0.2,
        max_poll_s: float = 2.0,
        grace_s: float = 30.0,
        owner: str | None = None,
    ) -> None:
        if batch_size < 1 or concurrency < 1:
            raise UserError("batch_size and concurrency must be at least 1")
        self.wh = wh
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.queue: Queue = wh.queue(table, job, owner=self.owner)
        self.handler = handler
        self.batch_size, self.concurrency = batch_size, concurrency
        self.lease_s = float(lease_s if lease_s is not None else self.queue.job.lease_s)
        self.poll_s, self.max_poll_s, self.grace_s = poll_s, max_poll_s, grace_s
        self.refresh_s = 5.0
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._stop_requested = False  # stop() was called (not an empty queue or max_batches)
        self._active: dict[int, Claim] = {}
        self._lock = threading.Lock()
        n = len(wh.cluster)
        self._backlog = [1.0] * n  # optimistic until measured
        self._labels = [(table, job, str(i)) for i in range(n)]

    # -- shard choice ------------------------------------------------------------------------
    def _pick_shard(self) -> int:
        n = len(self._backlog)
        if n == 1:
            return 0
        a, b = random.randrange(n), random.randrange(n)
        return a if self._backlog[a] >= self._backlog[b] else b

    def _refresh_backlog(self) -> None:
        for i in range(len(self._backlog)):
            try:
                st = self.queue.stats(i, cap=10_000)
            except RETRYABLE:
                self._backlog[i] = 0.0
                continue
            self._backlog[i] = float(st["ready"])
            metrics.backlog.labels(*self._labels[i]).set(st["ready"])
            metrics.leased.labels(*self._labels[i]).set(st["leased"])
            metrics.backing_off.labels(*self._labels[i]).set(st["backing_off"])
            metrics.oldest_ready.labels(*self._labels[i]).set(st["oldest_ready_s"])

    # -- the loop ------------------------------------------------------------------------------
    def stop(self, signum: int | None = None) -> None:
        """Stop claiming; running batches finish (up to ``grace_s``), the rest is released.

        ``signum``: the signal that asked for it (recorded in ``stats.stopped_by``).
        """
        if not self._stop.is_set():
            self._stop_requested = True
            self.stats.stopped_by = signum
        self._stop.set()

    def run(
        self,
        until_empty: bool = False,
        max_batches: int | None = None,
        install_signals: bool = False,
    ) -> WorkerStats:
        """Run until :meth:`stop`, SIGTERM (with ``install_signals``), or an empty queue."""
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, _frame: self.stop(signum))
        self._until_empty, self._max_batches = until_empty, max_batches
        self._refresh_backlog()
        beat = threading.Thread(target=self._heartbeat_loop, name="krablet-heartbeat", daemon=True)
        beat.start()
        slots = [
            threading.Thread(target=self._slot, name=f"krablet-slot-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for t in slots:
            t.start()
        while any(t.is_alive() for t in slots) and not self._stop.is_set():
            time.sleep(0.05)
        deadline = time.monotonic() + self.grace_s
        for t in slots:
            t.join(max(0.0, deadline - time.monotonic()))
        self._release_all()
        self._stop.set()
        beat.join(timeout=5)
        if self._stop_requested:
            self.stats.interrupted = not self._queue_drained()
        return self.stats

    def _slot(self) -> None:
        try:
            fn = instantiate(self.handler)
        except Exception as exc:
            self.stats.errors.append(f"handler setup failed: {exc!r}")
            self._stop.set()
            raise
        idle = self.poll_s
        while not self._stop.is_set():
            if self._max_batches is not None and self.stats.batches >= self._max_batches:
                return
            shard = self._pick_shard()
            try:
                t0 = time.perf_counter()
                claim = self.queue.claim(shard, self.batch_size, lease_s=self.lease_s)
                metrics.claim_latency.labels(*self._labels[shard]).observe(time.perf_counter() - t0)
            except RETRYABLE as exc:
                log.warning(
                    "worker: shard %d unreachable (%s); retrying", shard, type(exc).__name__
                )
                self._backlog[shard] = 0.0
                self._stop.wait(idle)
                idle = min(idle * 2, self.max_poll_s)
                continue
            if not claim.rows:
                self._backlog[shard] = 0.0
                if all(b == 0.0 for b in self._backlog):
                    if self._until_empty and self._queue_drained():
                        return
                    self._stop.wait(idle * random.uniform(0.5, 1.5))  # jittered poll
                    idle = min(idle * 2, self.max_poll_s)
                    self._refresh_backlog()
                continue
            idle = self.poll_s
            self._backlog[shard] = max(self._backlog[shard] - len(claim), 1.0)
            self._process(fn, claim)

    def _queue_drained(self) -> bool:
        """No ready rows and no live leases anywhere (a dead worker's leases come back)."""
        try:
            for i in range(len(self._backlog)):
                st = self.queue.stats(i, cap=1)
                if st["ready"] or st["leased"]:
                    return False
            return True
        except RETRYABLE:
            return False

    def _process(self, fn: Callable, claim: Claim) -> None:
        labels = self._labels[claim.shard]
        with self._lock:
            self._active[claim.token] = claim
        self.stats.claimed += len(claim)
        metrics.claims.labels(*labels).inc(len(claim))
        results: dict[Any, dict] = {}
        errors: dict[Any, str] = {}
        try:
            out = list(fn([dict(r) for r in claim.rows]))
            if len(out) != len(claim.rows):
                raise RuntimeError(
                    f"handler returned {len(out)} results for {len(claim.rows)} rows"
                )
            for key, res in zip(claim.keys, out, strict=True):
                if isinstance(res, BaseException):
                    errors[key] = f"{type(res).__name__}: {res}"
                elif isinstance(res, dict):
                    results[key] = res
                else:
                    errors[key] = f"handler returned {type(res).__name__}, expected a dict"
        except Exception as exc:
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            errors = dict.fromkeys(claim.keys, tb)
            results = {}
        try:
            done = self._retry(lambda: self.queue.complete(claim, results)) if results else []
        except UserError as exc:  # results that do not fit the job: fail those rows instead
            errors.update(dict.fromkeys(results, str(exc)))
            done = []
        failed = self._retry(lambda: self.queue.fail(claim, errors)) if errors else []
        with self._lock:
            self._active.pop(claim.token, None)
        self.stats.batches += 1
        self.stats.completed += len(done)
        self.stats.failed += len(failed)
        gone = len(results) - len(done) + len(errors) - len(failed)
        self.stats.lost += gone
        metrics.completions.labels(*labels).inc(len(done))
        metrics.failures.labels(*labels).inc(len(failed))
        if gone:
            metrics.lost.labels(*labels).inc(gone)

    def _retry(self, op: Callable[[], list]) -> list:
        """Run a write, retrying through connection loss (the lease may expire meanwhile)."""
        delay = 0.1
        while True:
            try:
                return op()
            except RETRYABLE as exc:
                if self._stop.is_set() and delay >= self.max_poll_s:
                    log.warning("worker: giving up a write at shutdown: %s", type(exc).__name__)
                    return []
                time.sleep(delay)
                delay = min(delay * 2, self.max_poll_s)

    def _heartbeat_loop(self) -> None:
        interval = max(self.lease_s / 3, 0.05)
        last_refresh = time.monotonic()
        while not self._stop.wait(interval):
            if time.monotonic() - last_refresh > self.refresh_s:
                self._refresh_backlog()  # also corrects the shard choice's estimates
                last_refresh = time.monotonic()
            with self._lock:
                active = list(self._active.values())
            for claim in active:
                with contextlib.suppress(*RETRYABLE):  # a missed beat: the next one may land
                    self.queue.heartbeat(claim, lease_s=self.lease_s)

    def _release_all(self) -> None:
        with self._lock:
            active, self._active = list(self._active.values()), {}
        for claim in active:
            with contextlib.suppress(*RETRYABLE):  # else the lease expires on its own
                self.stats.released += len(self.queue.release(claim))
