"""Optional dependencies (package extras) imported at the point of use, with one clear error.

``krea2-infra`` keeps its base install small: NVML, the Kubernetes client and PyYAML come
with the ``gpu`` and ``k8s`` extras. Code that needs one calls :func:`import_extra`, so a
missing extra is a :class:`MissingExtraError` naming the ``pip install`` that fixes it,
not a bare ``ModuleNotFoundError`` from deep inside a command.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from krea2.infra.errors import UserError


class MissingExtraError(UserError):
    """An optional dependency is not installed; the message names the extra to install."""


def import_extra(module: str, extra: str, distribution: str = "krea2-infra") -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``distribution[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module} is not installed ({exc}); install the extra: "
            f"pip install '{distribution}[{extra}]'"
        ) from None
