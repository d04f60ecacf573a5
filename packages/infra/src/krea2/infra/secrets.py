"""Secrets stay out of what krea2 writes: environment snapshots with their values hidden.

Run folders (``run.json``), hang bundles and reports record environment variables that
explain a run (NCCL, torch, OpenMP, krea2 settings). Some of those carry credentials
(``KREA2_REWARD_TOKEN``, a DSN with a password), and a run folder is shared, uploaded and
attached to issues, so every snapshot goes through :func:`recorded_environment`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

__all__ = ["REDACTED", "is_secret_name", "recorded_environment"]

REDACTED = "***"
# A name part that marks a credential: KREA2_REWARD_TOKEN, AWS_SECRET_ACCESS_KEY, PGPASSWORD,
# HF_TOKEN, KREA2_CLUSTER_SECRET, ..._API_KEY, ..._DSN (a DSN may hold a password).
_SECRET_PART = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|PRIVATE|AUTH|DSN|COOKIE|SESSION)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it may hold a credential."""
    return bool(_SECRET_PART.search(name)) or name.upper().endswith("_KEY")


def recorded_environment(
    prefixes: Iterable[str], names: Iterable[str] = (), env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables of ``env`` (default ``os.environ``) whose name starts with one of
    ``prefixes`` or is one of ``names``, sorted by name, with every credential's value
    replaced by ``***`` (the name stays: that a token was set can explain a run)."""
    source = os.environ if env is None else env
    starts, exact = tuple(prefixes), set(names)
    return {
        k: REDACTED if is_secret_name(k) else v
        for k, v in sorted(source.items())
        if k.startswith(starts) or k in exact
    }
