"""Micro-batching for servers: concurrent requests gathered into one blocking model call.

Requests wait in arrival order. The oldest sets the next batch's key (``key``: which
requests may share a call, e.g. an image shape); the batch closes when ``max_batch`` units
(``size``: images per request) of that key wait or the oldest has waited ``max_wait_ms``,
and takes requests of that key in arrival order, up to ``max_batch`` units. A request is
never split: one over ``max_batch`` is a batch of its own. Requests of other keys wait
their turn: the next batch is the oldest's again, so no key starves another.

``run_batch`` runs on one worker thread (it owns the model), so the event loop stays free
for new requests and health checks while a batch runs; it returns one result per request.
An exception it raises reaches every request of that batch, and the loop goes on. A request
whose future was cancelled (its client went away) before its batch started is dropped; one
already running finishes. A pause point (:mod:`krea2.infra.pause`) named ``pause`` stands
before each batch, counting the batches finished, so a test can hold the server mid-batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from krea2.infra.pause import pause_point

__all__ = ["MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Queued(Generic[T]):
    item: T
    key: Hashable
    size: int
    future: asyncio.Future
    queued_at: float = field(default_factory=time.monotonic)


class MicroBatcher(Generic[T, R]):
    """Gathers submitted requests into batches for ``run_batch`` (module docstring).

    ``run_batch(items) -> results``: one blocking call on the worker thread, one result per
    item in order. ``key(item)``: requests of equal keys may share a batch (default: all).
    ``size(item)``: the units a request holds (default 1). ``pause``: the label of the pause
    point before each batch; ``until`` ends its hold early (a server's draining event).
    ``on_batch(units)``: called with each batch's size before it runs (a histogram's
    ``observe``); ``on_queued(change)``: called as units join (+) and leave (-) the queue (a
    gauge's ``inc``). ``thread_name``: the worker thread's name prefix.

    Use: ``task = asyncio.create_task(batcher.run())``; ``await batcher.submit(item)``;
    on shutdown ``task.cancel()`` and ``batcher.close(error)``.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int,
        max_wait_ms: float,
        key: Callable[[T], Hashable] = lambda _: None,
        size: Callable[[T], int] = lambda _: 1,
        pause: str | None = None,
        until: threading.Event | None = None,
        on_batch: Callable[[int], object] | None = None,
        on_queued: Callable[[int], object] | None = None,
        thread_name: str = "batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch is {max_batch}; a batch holds at least 1 unit")
        self.run_batch, self.key, self.size = run_batch, key, size
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1000
        self.pause, self.until = pause, until
        self.on_batch, self.on_queued = on_batch, on_queued
        self.batches = 0  # batches finished: the count of the pause point
        self._queue: deque[_Queued[T]] = deque()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=thread_name)

    def submit(self, item: T) -> asyncio.Future[R]:
        """Queue ``item``; the future resolves to its result (or ``run_batch``'s error).
        Cancel it to drop the request while it still waits."""
        future = asyncio.get_running_loop().create_future()
        entry = _Queued(item, self.key(item), self.size(item), future)
        self._queue.append(entry)
        self._queued(entry.size)
        self._wake.set()
        return entry.future

    def queued(self) -> int:
        """Units waiting for a batch (requests dropped already left out)."""
        return sum(q.size for q in self._queue if not q.future.done())

    async def run(self) -> None:
        """Batch and run until cancelled."""
        while True:
            self._drop_done()
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = await self._gather(self._queue[0])
            if batch:
                await self._run(batch)

    def close(self, error: BaseException | None = None) -> None:
        """Stop the worker thread (a batch under way finishes) and fail every request still
        queued with ``error`` (None: leave them to the caller)."""
        while self._queue:
            entry = self._queue.popleft()
            self._queued(-entry.size)
            if error is not None and not entry.future.done():
                entry.future.set_exception(error)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _queued(self, change: int) -> None:
        if self.on_queued is not None:
            self.on_queued(change)

    def _drop_done(self) -> None:
        for entry in [q for q in self._queue if q.future.done()]:
            self._queue.remove(entry)
            self._queued(-entry.size)

    def _units_of(self, key: Hashable) -> int:
        return sum(q.size for q in self._queue if q.key == key and not q.future.done())

    async def _gather(self, oldest: _Queued[T]) -> list[_Queued[T]]:
        """Wait for the oldest's key to fill a batch or for its deadline; take the batch."""
        deadline = oldest.queued_at + self.max_wait_s
        while (remaining := deadline - time.monotonic()) > 0:
            if self._units_of(oldest.key) >= self.max_batch:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                break
        self._drop_done()
        batch: list[_Queued[T]] = []
        units = 0
        for entry in list(self._queue):
            if entry.key != oldest.key:
                continue
            if batch and units + entry.size > self.max_batch:
                break
            batch.append(entry)
            units += entry.size
            self._queue.remove(entry)
            self._queued(-entry.size)
        return batch

    async def _run(self, batch: list[_Queued[T]]) -> None:
        if self.on_batch is not None:
            self.on_batch(sum(q.size for q in batch))
        loop, items = asyncio.get_running_loop(), [q.item for q in batch]
        try:
            results = await loop.run_in_executor(self._executor, self._work, items)
        except Exception as e:  # run_batch failed: every request of the batch learns why
            for q in batch:
                if not q.future.done():
                    q.future.set_exception(e)
            return
        for q, result in zip(batch, results, strict=True):
            if not q.future.done():
                q.future.set_result(result)

    def _work(self, items: list[T]) -> Sequence[R]:
        """One batch, on the worker thread."""
        if self.pause is not None:
            pause_point(self.pause, self.batches, until=self.until)
        try:
            results = self.run_batch(items)
        finally:
            self.batches += 1
        if len(results) != len(items):
            raise ValueError(f"run_batch returned {len(results)} results for {len(items)} requests")
        return results
