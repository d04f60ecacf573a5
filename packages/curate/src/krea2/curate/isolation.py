"""Run per-image work in child processes with a CPU-time, wall-time and address-space bound.

A decode that hangs or balloons cannot take its worker down: the child is killed (time) or
gets a MemoryError (``RLIMIT_AS``), and that one image gets a reason instead of a result.

The time bound measures the item's own work, never the pool's: a child takes items only
once it has started and run ``warm_up``, and each item gets ``timeout_s`` seconds of *CPU
time* of its child (``RLIMIT_CPU``, enforced by the kernel, which kills a child stuck in C
code too) and, against a child that hangs without using the CPU, ``wall_timeout_s`` seconds
of wall time counted from the moment a ready child received it. So a machine with more
processes than cores slows items down without timing them out. An item whose child is
killed (time) or dies (a crash) is run once more in a fresh child before it is given up.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import pickle
import resource
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any


class IsolationTimeout(Exception):
    """The item used more than its CPU or wall time, in two fresh children in turn."""


class WorkerCrash(Exception):
    """The child died while working on the item (a signal or an exit), twice in a row."""


ATTEMPTS = 2  # a first try and one retry in a fresh child


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _serve(conn: Connection, memory_mb: int, timeout_s: float, warm_up: Any) -> None:
    """A child's loop: set up (one thread, bounded memory, ``warm_up``), say ``ready``, then
    answer each ``(fn, arg)`` with ``("ok", result)`` or ``("error", exception)``; each item
    runs under a CPU-time limit of ``timeout_s`` beyond what the child had used before it."""
    from krea2.curate.threads import single_threaded

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when children stop
    single_threaded()
    if memory_mb > 0:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if warm_up is not None:
        warm_up()
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    try:
        conn.send(("ready", None))
        while True:
            fn, arg = conn.recv()
            # The kernel sends SIGXCPU (default action: terminate) past the soft limit.
            soft = math.ceil(_cpu_seconds() + timeout_s)
            capped = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
            resource.setrlimit(resource.RLIMIT_CPU, (capped, hard))
            try:
                reply: tuple[str, Any] = ("ok", fn(arg))
            except Exception as exc:
                reply = ("error", exc)
            resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
            try:
                conn.send(reply)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                conn.send(("error", RuntimeError(f"unpicklable result: {exc}")))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone or closed the pool: nothing left to answer


@dataclass
class _Child:
    """One child process, its pipe, and the item it is working on (None when idle)."""

    process: Any
    conn: Connection
    ready: bool = False
    item: int | None = None
    started: float = 0.0


@dataclass
class _Item:
    arg: Any
    failures: list[str] = field(default_factory=list)


class IsolatedPool:
    """``processes`` spawned children; ``map(fn, args)`` returns one result or exception per
    arg (``IsolationTimeout``, ``WorkerCrash``, or what ``fn`` raised). ``fn`` (and
    ``warm_up``, run once in each child before it takes work) must be importable or
    picklable. ``timeout_s``: CPU seconds per item; ``wall_timeout_s`` (default 3 ×
    ``timeout_s``): wall seconds per item from the moment its child received it."""

    def __init__(
        self,
        processes: int = 1,
        timeout_s: float = 30.0,
        memory_mb: int = 3072,
        warm_up: Callable[[], Any] | None = None,
        wall_timeout_s: float | None = None,
    ) -> None:
        self.processes, self.timeout_s, self.memory_mb = max(1, processes), timeout_s, memory_mb
        self.wall_timeout_s = wall_timeout_s if wall_timeout_s is not None else 3 * timeout_s
        self.warm_up = warm_up
        self.retried = 0  # items run again in a fresh child after a timeout or a crash
        self._ctx = mp.get_context("spawn")  # workers run threads: never fork them
        self._children = [self._spawn() for _ in range(self.processes)]

    def _spawn(self) -> _Child:
        parent, child = self._ctx.Pipe()
        args = (child, self.memory_mb, self.timeout_s, self.warm_up)
        process = self._ctx.Process(target=_serve, args=args, daemon=True)
        process.start()
        child.close()
        return _Child(process, parent)

    def _replace(self, i: int) -> None:
        child = self._children[i]
        if child.process.is_alive():
            child.process.kill()
        child.process.join()
        child.conn.close()
        self._children[i] = self._spawn()

    def map(self, fn: Callable[[Any], Any], args: Sequence[Any]) -> list[Any]:
        items = [_Item(a) for a in args]
        out: list[Any] = [None] * len(items)
        todo = deque(range(len(items)))
        left = len(items)
        deaths_before_ready = 0
        while left:
            for child in self._children:
                if child.ready and child.item is None and todo:
                    child.item, child.started = todo.popleft(), time.monotonic()
                    child.conn.send((fn, items[child.item].arg))
            busy = [c for c in self._children if c.item is not None]
            wake = min((c.started + self.wall_timeout_s for c in busy), default=None)
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            ready = wait([c.conn for c in self._children], timeout)
            for i, child in enumerate(self._children):
                failure = None
                if child.conn in ready:
                    try:
                        kind, value = child.conn.recv()
                    except (EOFError, OSError):
                        child.process.join()
                        code = child.process.exitcode
                        if child.item is None:  # died while starting or idle
                            deaths_before_ready += not child.ready
                            if deaths_before_ready > 2 * self.processes:
                                raise RuntimeError(
                                    f"isolated worker processes die while starting (exit code "
                                    f"{code}); run `warm_up` in this process to see why"
                                ) from None
                        elif code == -signal.SIGXCPU:
                            failure = f"used more than {self.timeout_s} s of CPU time"
                        elif code in (-signal.SIGTERM, -signal.SIGHUP):
                            todo.appendleft(child.item)  # stopped from outside: not its fault
                        else:
                            failure = f"worker died (exit code {code})"
                        self._replace(i)
                    else:
                        if kind == "ready":
                            child.ready = True
                        else:
                            out[child.item] = value
                            child.item = None
                            left -= 1
                elif child.item is not None and (
                    time.monotonic() - child.started > self.wall_timeout_s
                ):
                    failure = f"no answer within {self.wall_timeout_s} s of wall time"
                    self._replace(i)
                if failure is not None:
                    k = child.item
                    assert k is not None
                    items[k].failures.append(failure)
                    if len(items[k].failures) < ATTEMPTS:
                        self.retried += 1
                        todo.appendleft(k)
                    else:
                        timed_out = any("time" in f for f in items[k].failures)
                        error = IsolationTimeout if timed_out else WorkerCrash
                        out[k] = error("; then, in a fresh worker, ".join(items[k].failures))
                        left -= 1
        return out

    def close(self) -> None:
        for child in self._children:
            child.conn.close()
            if child.process.is_alive():
                child.process.kill()
            child.process.join()
