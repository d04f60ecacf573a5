"""Job handlers: load one by name, and run it over a claimed batch so one bad row fails alone.

A handler takes a list of rows (dicts with the key and the job's inputs) and returns one result
per row, in order: a dict of result columns, or an Exception instance to fail that row alone.
A class with an optional ``setup()`` and a ``__call__(rows)`` is instantiated once per slot.

If the handler *raises*, :class:`BatchRunner` bisects the batch: it runs each half again (and
so on down to single rows), so only the rows that make it raise are failed; the others keep
their results, their attempt count and no error. A handler that breaks its contract (returns
something other than a list of one dict-or-Exception per row) fails the rows concerned with a
message saying what it returned, logged once per kind of mistake instead of once per row.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from krea2.infra.errors import UserError

log = logging.getLogger("krea2.krablet.worker")


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


def instantiate(handler: Any) -> Callable[[list[dict]], Any]:
    """A callable for one slot: classes are instantiated and set up once."""
    if isinstance(handler, type):
        obj = handler()
        if hasattr(obj, "setup"):
            obj.setup()
        return obj
    return handler


def one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, its last line only."""
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


class BatchRunner:
    """Runs handlers over batches; reports each contract mistake once in the worker log.

    ``check(key, values)`` (optional) returns ``(kind, message)`` saying why a result dict
    cannot be written (unknown columns, a NULL done marker), or None; such rows fail as
    contract mistakes too.
    """

    def __init__(self, check: Callable[[Any, dict], tuple[str, str] | None] | None = None) -> None:
        self.check = check
        self.calls = 0  # handler invocations, bisection included
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    def run(
        self, fn: Callable[[list[dict]], Any], rows: Sequence[dict], keys: Sequence[Any]
    ) -> tuple[dict[Any, dict], dict[Any, str]]:
        """``fn`` over ``rows`` → (results by key, error text by key); every key is in one."""
        self.calls += 1
        try:
            out = fn([dict(r) for r in rows])
        except Exception as exc:
            if len(rows) == 1:
                return {}, {keys[0]: one_line(exc)}
            mid = len(rows) // 2  # bisect: the rows that do not make it raise keep their results
            res_a, err_a = self.run(fn, rows[:mid], keys[:mid])
            res_b, err_b = self.run(fn, rows[mid:], keys[mid:])
            return {**res_a, **res_b}, {**err_a, **err_b}
        return self._sort(out, keys)

    def _sort(self, out: Any, keys: Sequence[Any]) -> tuple[dict[Any, dict], dict[Any, str]]:
        if isinstance(out, (str, bytes, dict)) or not isinstance(out, Sequence):
            try:
                out = list(out)  # a generator is fine
            except TypeError:
                out = None
        if out is None or len(out) != len(keys):
            got = "a non-list" if out is None else f"{len(out)} results"
            kind = "handler returned a different number of results than rows"
            message = f"{kind} ({got} for {len(keys)} rows)"
            self.report(kind, message)
            return {}, dict.fromkeys(keys, message)
        results: dict[Any, dict] = {}
        errors: dict[Any, str] = {}
        for key, res in zip(keys, out, strict=True):
            if isinstance(res, BaseException):
                errors[key] = one_line(res)
            elif not isinstance(res, dict):
                message = (
                    f"handler returned {type(res).__name__} for a row, expected a dict of "
                    "result columns (or an Exception to fail the row)"
                )
                self.report(message, message)
                errors[key] = message
            elif self.check is not None and (problem := self.check(key, res)) is not None:
                self.report(*problem)
                errors[key] = problem[1]
            else:
                results[key] = res
        return results, errors

    def report(self, kind: str, message: str) -> None:
        """Log ``message`` the first time a mistake of this ``kind`` happens."""
        with self._lock:
            if kind in self._reported:
                return
            self._reported.add(kind)
        log.error("worker: %s; every such row fails (reported once)", message)
