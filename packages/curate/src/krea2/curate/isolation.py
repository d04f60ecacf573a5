"""Run per-image work in child processes with a wall-clock and an address-space bound.

A decode that hangs or balloons cannot take its worker down: the child is killed (time) or
gets a MemoryError (``RLIMIT_AS``), and that one image gets a reason instead of a result.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any


class IsolationTimeout(Exception):
    """The child did not answer within the time bound (hung or crashed); it was replaced."""


def _init_worker(memory_mb: int, warm_up: Callable[[], Any] | None) -> None:
    """Each child: one thread (one worker per core, see ``threads``), bounded memory, then
    ``warm_up`` (one-time loading that should not count against an item's time bound)."""
    from krea2.curate.threads import single_threaded

    single_threaded()
    if memory_mb > 0:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if warm_up is not None:
        warm_up()


class IsolatedPool:
    """``processes`` spawned children; ``map(fn, args)`` returns one result or exception per
    arg. ``fn`` (and ``warm_up``, run once in each child as it starts) must be importable
    (module-level functions)."""

    def __init__(
        self,
        processes: int = 1,
        timeout_s: float = 30.0,
        memory_mb: int = 3072,
        warm_up: Callable[[], Any] | None = None,
    ) -> None:
        self.processes, self.timeout_s, self.memory_mb = processes, timeout_s, memory_mb
        self.warm_up = warm_up
        self._ctx = mp.get_context("spawn")  # workers run threads: never fork them
        self._pool = self._start()

    def _start(self) -> Any:
        return self._ctx.Pool(
            self.processes, initializer=_init_worker, initargs=(self.memory_mb, self.warm_up)
        )

    def map(self, fn: Callable[[Any], Any], args: Sequence[Any]) -> list[Any]:
        pending = [self._pool.apply_async(fn, (a,)) for a in args]
        start = time.monotonic()
        out: list[Any] = []
        broken = False
        for i, res in enumerate(pending):
            # Item i starts at the latest after i // processes earlier items finished.
            deadline = start + self.timeout_s * (1 + i // self.processes)
            try:
                out.append(res.get(timeout=max(0.0, deadline - time.monotonic())))
            except mp.TimeoutError:
                out.append(IsolationTimeout(f"no answer within {self.timeout_s} s"))
                broken = True
            except Exception as exc:  # raised inside the child, pickled back
                out.append(exc)
        if broken:
            self._pool.terminate()
            self._pool.join()
            self._pool = self._start()
        return out

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()
