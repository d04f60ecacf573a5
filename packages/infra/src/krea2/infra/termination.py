"""SIGTERM as an honest stop: what a scheduler sends ends a command the way Ctrl-C does.

Kubernetes, Slurm and ``kill`` stop a process with SIGTERM, whose default action ends
Python at once: no checkpoint in flight finished, no message, worker processes left
behind. Inside :func:`sigterm_as_interrupt` SIGTERM raises :class:`Terminated`, a
``KeyboardInterrupt``, so every path that handles Ctrl-C (the trainer finishing its
checkpoint and saying where ``--resume`` continues, the demo stopping its workers) handles
it too; the command then exits 143 (128 + 15), as a shell reports it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["TERMINATED_EXIT_CODE", "Terminated", "sigterm_as_interrupt", "terminated"]

TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
_received = threading.Event()


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM arrives inside :func:`sigterm_as_interrupt`."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.set()
    raise Terminated()


def terminated() -> bool:
    """Whether SIGTERM arrived since the innermost :func:`sigterm_as_interrupt` began (a
    ``KeyboardInterrupt`` may have been re-raised as something else on its way up)."""
    return _received.is_set()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while inside; the previous
    handler is restored after. Off the main thread (where Python cannot set handlers) it
    changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _received.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
