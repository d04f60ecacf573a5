"""Workers: claim batches from the reachable shards with the most backlog, run a handler, write
results.

Handlers and how a raising one is bisected are in :mod:`krea2.krablet.handler`. Shards are
chosen by two random choices weighted by a cached backlog estimate, so 1 or 1,000 workers
spread over the shards without coordination. Each shard is isolated: a shard that cannot be
reached is skipped (its circuit fails calls at once, see :mod:`krea2.krablet.connections`), a
monitor thread probes it with backoff and refreshes the backlog estimates, and results for a
batch whose shard went away are kept and written when it comes back (if the lease is still
ours). Slots, start-up and the heartbeat never wait on a dead shard for longer than one
connect timeout. Leases are extended by a heartbeat thread every ``lease_s / 3``. ``stop()``
(SIGTERM/SIGINT under ``run``) stops claiming, lets running batches finish for up to
``grace_s`` and releases whatever is still unfinished.

Each worker is a pause point (:mod:`krea2.infra.pause`) named ``krablet TABLE.JOB``, counted
in finished batches: with ``KREA2_PAUSE_AT='krablet nums.square:2'`` every slot holds its
next claimed batch, leases kept alive, once two batches are done, until ``stop()`` (a signal)
or the pause's time limit. A test can so SIGKILL or signal a worker provably mid-batch.
"""

# long module: one Worker whose claim loop, shard health, batch settlement and background
# threads all share the run's state (handlers and their bisection are in handler.py)

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

import krea2.krablet.metrics as metrics
from krea2.infra.errors import UserError
from krea2.infra.pause import pause_point
from krea2.krablet.connections import ShardUnavailable
from krea2.krablet.handler import BatchRunner, instantiate, one_line, resolve_handler
from krea2.krablet.queue import Claim, Queue
from krea2.krablet.warehouse import Warehouse

__all__ = ["RETRYABLE", "Worker", "WorkerStats", "resolve_handler"]

log = logging.getLogger(__name__)
# errors that mean "the shard is (momentarily) unreachable", never "the data is wrong"
RETRYABLE = (ShardUnavailable, psycopg.OperationalError, psycopg.InterfaceError)


@dataclass
class WorkerStats:
    """What one :meth:`Worker.run` did (counts are rows, except ``batches``).

    ``interrupted``: :meth:`Worker.stop` (or SIGTERM/SIGINT) ended the run while the job still
    had ready or leased rows on a reachable shard; ``stopped_by`` is that signal's number
    (None for a plain ``stop()``). ``unreachable_shards``: shard indexes that could not be
    reached when the run ended (their rows were not worked on); ``unreachable`` describes each
    as ``shard N (host …)``, never with a password. ``failing``: after an ``until_empty`` run
    that ended by itself, the job's rows that failed and are backing off, on the reachable
    shards (any worker's failures, not only this run's).
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
    failing: int = 0

    @property
    def finished(self) -> bool:
        """True when the run was not interrupted, reached every shard and left no failed row."""
        return not self.interrupted and not self.unreachable_shards and not self.failing


class Worker:
    """Runs one job's handler over the cluster until stopped (or until the queue is empty).

    ``give_up_s``: with ``until_empty``, how long a shard may stay unreachable once the
    reachable shards are drained before the run ends without it (it is then listed in
    ``stats.unreachable_shards``).
    """

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
        give_up_s: float = 30.0,
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
        self.give_up_s = give_up_s
        self.refresh_s = 5.0
        self.stats = WorkerStats()
        self._batches = BatchRunner(check=self.queue.result_problem)
        self._stop = threading.Event()
        self._stop_requested = False  # stop() was called (not an empty queue or max_batches)
        self._until_empty, self._max_batches = False, None
        self._active: dict[int, Claim] = {}  # token → claim not yet settled
        self._parked: list[tuple[Claim, dict, dict]] = []  # settled later: shard unreachable
        self._down: set[int] = set()  # shards reported unreachable (logged once per outage)
        self._lock = threading.Lock()
        n = len(wh.cluster)
        self._backlog = [1.0] * n  # optimistic until measured
        self._labels = [(table, job, str(i)) for i in range(n)]
        self._pause_label = f"krablet {table}.{job}"

    # -- shard choice and health -------------------------------------------------------------
    def _pick_shard(self) -> int | None:
        """Two random choices among the reachable shards, by backlog; None if none is up."""
        up = [i for i in range(len(self._backlog)) if self.wh.cluster.is_up(i)]
        if len(up) <= 1:
            return up[0] if up else None
        a, b = random.choice(up), random.choice(up)
        return a if self._backlog[a] >= self._backlog[b] else b

    def _shard_lost(self, shard: int, exc: BaseException) -> None:
        self._backlog[shard] = 0.0
        with self._lock:
            first = shard not in self._down
            self._down.add(shard)
        if first:
            reason = str(exc) if isinstance(exc, ShardUnavailable) else one_line(exc)
            log.warning("worker: %s; skipping it, retrying with backoff", reason)

    def _refresh_backlog(self, shards: list[int] | None = None) -> None:
        """Re-measure the backlog of ``shards`` (default: all). An unreachable shard fails at
        once until its backoff has passed, then this call is its probe."""
        for i in range(len(self._backlog)) if shards is None else shards:
            try:
                st = self.queue.stats(i, cap=10_000)
            except RETRYABLE as exc:
                self._shard_lost(i, exc)
                continue
            with self._lock:
                back = i in self._down
                self._down.discard(i)
            if back:
                log.warning("worker: %s is reachable again", self.wh.cluster.describe(i))
            self._backlog[i] = float(st["ready"])
            metrics.backlog.labels(*self._labels[i]).set(st["ready"])
            metrics.leased.labels(*self._labels[i]).set(st["leased"])
            metrics.backing_off.labels(*self._labels[i]).set(st["backing_off"])
            metrics.oldest_ready.labels(*self._labels[i]).set(st["oldest_ready_s"])

    def _unreachable(self) -> list[int]:
        return [i for i in range(len(self._backlog)) if not self.wh.cluster.is_up(i)]

    # -- the loop ------------------------------------------------------------------------------
    def stop(self, signum: int | None = None) -> None:
        """Stop claiming; running batches finish (up to ``grace_s``), the rest is released.

        ``signum``: the signal that asked for it (recorded in ``stats.stopped_by``).
        """
        if not self._stop_requested:
            # the first request is recorded even after the run ended by itself: a signal is
            # then still the run's outcome (the CLI exits 128 + signum whatever the timing)
            self._stop_requested = True
            self.stats.stopped_by = signum
        self._stop.set()

    def run(
        self,
        until_empty: bool = False,
        max_batches: int | None = None,
        install_signals: bool = False,
    ) -> WorkerStats:
        """Run until :meth:`stop`, SIGTERM/SIGINT (with ``install_signals``), ``max_batches``,
        or (``until_empty``) until no reachable shard has ready or leased rows and every other
        shard has been unreachable for ``give_up_s``."""
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, _frame: self.stop(signum))
        self._until_empty, self._max_batches = until_empty, max_batches
        self._refresh_backlog()
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="krablet-heartbeat", daemon=True),
            threading.Thread(target=self._monitor_loop, name="krablet-monitor", daemon=True),
        ]
        slots = [
            threading.Thread(target=self._slot, name=f"krablet-slot-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for t in threads + slots:
            t.start()
        while any(t.is_alive() for t in slots) and not self._stop.is_set():
            time.sleep(0.05)
        deadline = time.monotonic() + self.grace_s
        for t in slots:
            t.join(max(0.0, deadline - time.monotonic()))
        stopping = self._stop.is_set()
        self._stop.set()
        for t in threads:
            t.join(timeout=5)
        self._settle_parked(final=True)
        self._release_all()
        if stopping and self._stop_requested:
            self.stats.interrupted = not self._drained(wait_for_down=False)
        elif until_empty and not stopping:
            self.stats.failing = self._failing()
        down = self._unreachable()
        self.stats.unreachable_shards = down
        self.stats.unreachable = [self.wh.cluster.describe(i) for i in down]
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
            claim = None
            if shard is not None:
                try:
                    t0 = time.perf_counter()
                    claim = self.queue.claim(shard, self.batch_size, lease_s=self.lease_s)
                    metrics.claim_latency.labels(*self._labels[shard]).observe(
                        time.perf_counter() - t0
                    )
                except RETRYABLE as exc:
                    self._shard_lost(shard, exc)
                    continue  # another shard, at once: a dead one never slows the others
            if claim is not None and claim.rows:
                idle = self.poll_s
                self._backlog[shard] = max(self._backlog[shard] - len(claim), 1.0)
                self._process(fn, claim)
                continue
            if shard is not None:
                self._backlog[shard] = 0.0
            if all(self._backlog[i] == 0.0 for i in range(len(self._backlog))):
                if self._until_empty and self._drained(wait_for_down=True):
                    return
                self._stop.wait(idle * random.uniform(0.5, 1.5))  # jittered poll
                idle = min(idle * 2, self.max_poll_s)
                self._refresh_backlog([i for i in range(len(self._backlog)) if i not in self._down])

    def _drained(self, wait_for_down: bool) -> bool:
        """No ready rows and no live leases on any reachable shard (a dead worker's leases come
        back), no results waiting for a shard; with ``wait_for_down``, also every unreachable
        shard has been unreachable for ``give_up_s``."""
        for i in range(len(self._backlog)):
            try:
                st = self.queue.stats(i, cap=1)
            except RETRYABLE as exc:
                self._shard_lost(i, exc)
                if wait_for_down and self.wh.cluster.down_for(i) < self.give_up_s:
                    return False
                continue
            if st["ready"] or st["leased"]:
                return False
        with self._lock:
            parked = {c.shard for c, _, _ in self._parked}
        return not (parked - set(self._unreachable()))

    def _failing(self) -> int:
        """Rows of the job that failed and are not done, on the shards that answer."""
        total = 0
        for i in range(len(self._backlog)):
            with contextlib.suppress(*RETRYABLE):  # an unreachable shard is reported as such
                total += self.queue.failing(i)
        return total

    # -- one batch -------------------------------------------------------------------------------
    def _process(self, fn: Callable, claim: Claim) -> None:
        metrics.claims.labels(*self._labels[claim.shard]).inc(len(claim))
        with self._lock:
            self._active[claim.token] = claim
            self.stats.claimed += len(claim)
        self._hold()
        results, errors = self._batches.run(fn, claim.rows, claim.keys)
        with self._lock:
            self.stats.batches += 1
        if not self._settle(claim, results, errors):
            with self._lock:
                self._parked.append((claim, results, errors))

    def _hold(self) -> None:
        """The pause point (module docstring), before a claimed batch's handler runs; ``stop()``
        ends the hold as it ends a run, and the held batches then finish like running ones."""
        pause_point(self._pause_label, self.stats.batches, until=self._stop)

    def _settle(self, claim: Claim, results: dict, errors: dict) -> bool:
        """Write a batch's results and failures (emptying both as they land); False if its
        shard is unreachable (the caller keeps them for later)."""
        try:
            if results:
                done = self._complete(claim, results, errors)
                self._count(claim, "completed", len(done), len(results) - len(done))
                results.clear()
            if errors:
                failed = self.queue.fail(claim, errors)
                self._count(claim, "failed", len(failed), len(errors) - len(failed))
                errors.clear()
        except RETRYABLE as exc:
            self._shard_lost(claim.shard, exc)
            return False
        with self._lock:
            self._active.pop(claim.token, None)
        return True

    def _complete(self, claim: Claim, results: dict, errors: dict) -> list:
        """``queue.complete``; if the database refuses a value, each row alone, so only the
        refused rows fail (moved from ``results`` to ``errors``)."""
        try:
            return self.queue.complete(claim, results)
        except RETRYABLE:
            raise
        except psycopg.Error:
            if len(results) == 1:
                raise
        done = []
        for key in sorted(results):
            try:
                done += self.queue.complete(claim, {key: results[key]})
            except RETRYABLE:
                raise
            except psycopg.Error as exc:
                message = f"the database refused the result: {one_line(exc)}"
                self._batches.report(f"refused:{type(exc).__name__}", message)
                errors[key] = message
        for key in errors:
            results.pop(key, None)
        return done

    def _count(self, claim: Claim, what: str, landed: int, lost: int) -> None:
        labels = self._labels[claim.shard]
        with self._lock:
            setattr(self.stats, what, getattr(self.stats, what) + landed)
            self.stats.lost += lost
        (metrics.completions if what == "completed" else metrics.failures).labels(*labels).inc(
            landed
        )
        if lost:
            metrics.lost.labels(*labels).inc(lost)

    def _settle_parked(self, final: bool = False) -> None:
        """Write kept results whose shard is back; at the end, count the rest as lost leases
        (they expire and the rows run again)."""
        with self._lock:
            parked, self._parked = self._parked, []
        keep = []
        for claim, results, errors in parked:
            if not (self.wh.cluster.is_up(claim.shard) or final) or not self._settle(
                claim, results, errors
            ):
                keep.append((claim, results, errors))
        if final:
            for claim, results, errors in keep:
                self._count(claim, "completed", 0, len(results) + len(errors))
            keep = []
        with self._lock:
            self._parked.extend(keep)

    # -- background threads -------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        """Probe unreachable shards (their circuit sets the pace), refresh the backlog
        estimates every ``refresh_s`` and write kept results once their shard is back."""
        last_refresh = time.monotonic()
        while not self._stop.wait(0.25):
            if time.monotonic() - last_refresh > self.refresh_s:
                self._refresh_backlog()
                last_refresh = time.monotonic()
            elif self._down:
                self._refresh_backlog(sorted(self._down))
            self._settle_parked()

    def _heartbeat_loop(self) -> None:
        interval = max(self.lease_s / 3, 0.05)
        while not self._stop.wait(interval):
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
