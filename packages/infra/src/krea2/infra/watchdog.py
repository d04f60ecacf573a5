"""Hang watchdog: a diagnostic bundle from every rank before a stuck run is killed.

The report's large runs died of NCCL timeouts while every metric looked healthy. When a
collective hangs, every rank stops making progress, so each rank's own watchdog fires;
set its timeout below the collective timeout (:func:`hang_timeout`) and each rank writes
its part of one bundle directory before the process group gives up:

* ``rank-00003.stacks.txt``: every Python thread's stack, written by :mod:`faulthandler`
  from its own C thread, so it works even when the stuck call holds the GIL; the same
  file receives a dump on ``kill -USR1 <pid>`` at any time;
* ``rank-00003.json``: host, pid, last step and how long ago, the last metrics given to
  :meth:`HangWatchdog.beat`, and the NCCL / torch / CUDA environment.

Then the watchdog ends the process with :data:`HANG_EXIT_CODE`, so torchrun or the
JobSet restarts the job from its last checkpoint instead of waiting on a dead peer.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import krea2.infra.metrics as m
from krea2.infra.logging import get_logger
from krea2.infra.secrets import recorded_environment

log = get_logger("infra.watchdog")
HANG_EXIT_CODE = 124  # as coreutils' timeout: the job ran past its deadline
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "NVIDIA_", "OMP_", "MASTER_", "PET_", "KREA2_")
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_NAME", "POD_NAME", "HOSTNAME")
# The stacks are dumped this long before the process is ended, to leave the C thread
# time to finish writing them.
STACK_GRACE_S = 0.5


def hang_timeout(collective_timeout_s: float, margin: float = 0.8) -> float:
    """A watchdog timeout that fires before the collective timeout kills the run (s)."""
    return max(1.0, collective_timeout_s * margin)


def watchdog_metrics() -> dict[str, Any]:
    labels = ("rank",)
    return {
        "progress": m.gauge(
            "infra",
            "watchdog_last_progress_timestamp_seconds",
            "Unix time of the rank's last finished step.",
            labels,
            "max",
        ),
        "bundles": m.counter(
            "infra", "watchdog_bundles_total", "Hang bundles written by this rank.", labels
        ),
    }


def collect_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables that explain a distributed hang (NCCL, torch, CUDA...),
    credentials' values hidden (:func:`krea2.infra.secrets.recorded_environment`)."""
    return recorded_environment(ENV_PREFIXES, ENV_NAMES, env)


class HangWatchdog:
    """Writes this rank's part of a hang bundle when :meth:`beat` stops for ``timeout_s``.

    ``on_hang``: ``"exit"`` (end the process with :data:`HANG_EXIT_CODE`) or ``"report"``
    (write the bundle and keep running). ``last_metrics`` is called for the bundle when
    given; :meth:`beat` can carry the metrics instead.
    """

    def __init__(
        self,
        bundle_dir: Path,
        timeout_s: float,
        rank: int = 0,
        on_hang: str = "exit",
        last_metrics: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        if on_hang not in ("exit", "report"):
            raise ValueError(f"on_hang={on_hang!r} must be 'exit' or 'report'")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive")
        self.bundle_dir = Path(bundle_dir)
        self.timeout_s = timeout_s
        self.rank = rank
        self.on_hang = on_hang
        self.last_metrics = last_metrics
        self.fired = threading.Event()
        self._step: int | None = None
        self._metrics: dict[str, Any] = {}
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks: Any = None
        self._gauges = watchdog_metrics()

    @classmethod
    def from_env(
        cls, collective_timeout_s: float, rank: int, env: Mapping[str, str] | None = None
    ) -> HangWatchdog | None:
        """The watchdog a launched rank runs, or None when ``KREA2_HANG_DIR`` is unset.

        ``krea2 infra launch`` sets ``KREA2_HANG_DIR`` (the run's bundle directory) and
        may set ``KREA2_HANG_TIMEOUT_S``; otherwise the timeout is
        :func:`hang_timeout` of the run's collective timeout (``parallel.timeout_s``).
        """
        env = os.environ if env is None else env
        folder = env.get("KREA2_HANG_DIR")
        if not folder:
            return None
        timeout = env.get("KREA2_HANG_TIMEOUT_S")
        timeout_s = float(timeout) if timeout else hang_timeout(collective_timeout_s)
        return cls(Path(folder), timeout_s, rank=rank)

    @property
    def stacks_path(self) -> Path:
        return self.bundle_dir / f"rank-{self.rank:05d}.stacks.txt"

    @property
    def info_path(self) -> Path:
        return self.bundle_dir / f"rank-{self.rank:05d}.json"

    def start(self) -> HangWatchdog:
        self.bundle_dir.mkdir(parents=True, exist_ok=True)
        self._stacks = self.stacks_path.open("w")
        if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
        self._last = time.monotonic()
        self._arm()
        self._thread = threading.Thread(target=self._watch, name="krea2-watchdog", daemon=True)
        self._thread.start()
        return self

    def _arm(self) -> None:
        # faulthandler's timer runs in C: the stacks get written even if the stuck call
        # never releases the GIL and this module's Python thread never runs again.
        faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self._stacks)

    def beat(self, step: int, metrics: dict[str, Any] | None = None) -> None:
        """Mark progress (call once per finished step); re-arms the stack dump."""
        self._step = step
        if metrics is not None:
            self._metrics = dict(metrics)
        self._last = time.monotonic()
        self._gauges["progress"].labels(str(self.rank)).set(time.time())
        if self._stacks is not None and not self.fired.is_set():
            self._arm()

    def _watch(self) -> None:
        poll = min(1.0, self.timeout_s / 10)
        while not self._stop.wait(poll):
            idle = time.monotonic() - self._last
            if idle < self.timeout_s + STACK_GRACE_S:
                continue
            self.write_bundle(idle)
            if self.on_hang == "exit":
                log.error(
                    "rank %d: no progress for %.0f s; bundle in %s; exiting with %d",
                    self.rank,
                    idle,
                    self.bundle_dir,
                    HANG_EXIT_CODE,
                )
                logging_flush()
                os._exit(HANG_EXIT_CODE)
            return

    def write_bundle(self, idle_s: float) -> Path:
        """Write ``rank-N.json`` (the stacks file is faulthandler's); returns its path."""
        self.fired.set()
        self._stacks.flush()
        metrics = dict(self._metrics)
        if self.last_metrics is not None:
            try:
                metrics.update(self.last_metrics())
            except Exception as exc:  # a diagnostic must not fail on its own diagnostics
                metrics["error"] = f"last_metrics failed: {type(exc).__name__}: {exc}"
        info = {
            "rank": self.rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.time(),
            "last_step": self._step,
            "idle_s": round(idle_s, 3),
            "timeout_s": self.timeout_s,
            "stacks": self.stacks_path.name,
            "last_metrics": metrics,
            "env": collect_env(),
        }
        tmp = self.info_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(info, indent=1, default=str))
        tmp.replace(self.info_path)
        self._gauges["bundles"].labels(str(self.rank)).inc()
        return self.info_path

    def stop(self) -> None:
        """Disarm (a normal end): no dump, no exit."""
        self._stop.set()
        faulthandler.cancel_dump_traceback_later()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._stacks is not None:
            if hasattr(signal, "SIGUSR1"):
                faulthandler.unregister(signal.SIGUSR1)
            self._stacks.close()
            self._stacks = None


def logging_flush() -> None:
    """Flush every logging handler (``os._exit`` skips the interpreter's own flush)."""
    import logging

    for handler in logging.getLogger().handlers + logging.getLogger("krea2").handlers:
        handler.flush()
