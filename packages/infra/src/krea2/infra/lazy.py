"""Lazy package roots: a package names its public API without importing its submodules.

Every ``krea2`` command imports every package root (the CLI host reads their entry points),
so a root that imported torch, numba or psycopg would tax each command. A root instead
declares where each public name lives and installs the pair this module builds::

    _HOMES = {"Warehouse": "warehouse", "sql": None}   # None: the name is a submodule
    __all__ = [*_HOMES]
    __getattr__, __dir__ = lazy_exports(__name__, _HOMES)

This module imports nothing but ``importlib`` and ``sys``, so it adds no import cost.
"""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # typing is not imported at run time: it is most of a root's cost
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str | None]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the root of ``package``.

    ``homes`` maps each public name to the submodule (relative to ``package``) that defines
    it, or to None when the name is a submodule itself. A name is imported on first access
    and then stored in the root's namespace, so later lookups skip ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        home = homes[name]
        module = importlib.import_module(f"{package}.{name if home is None else home}")
        value = module if home is None else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(homes)

    return __getattr__, __dir__
