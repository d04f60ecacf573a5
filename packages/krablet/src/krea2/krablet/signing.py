"""HMAC signatures with the cluster secret: for code that travels through the database.

Two things in the database name code a worker will run: pluck maps (a pickled function) and a
job's declared handler (``module:function`` in the shard's ``krablet_catalog``). Whoever can
write to a shard could otherwise make every worker import a file of their choosing, so both
are signed with the cluster's secret (the cluster file, or ``$KRABLET_SECRET``) by the process
that declares them, and verified by the worker before anything is unpickled or imported.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from krea2.infra.errors import UserError

MIN_SECRET_CHARS = 16


def sign(secret: str, *parts: bytes | str) -> str:
    """HMAC-SHA256 (hex) of ``parts``, each length-prefixed so no two part lists collide."""
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        mac.update(len(b).to_bytes(8, "big"))
        mac.update(b)
    return mac.hexdigest()


def usable_secret(secret: str | None) -> bool:
    """Whether ``secret`` is long enough to sign code with."""
    return bool(secret) and len(secret) >= MIN_SECRET_CHARS


def signature_matches(expected: str, given: Any) -> bool:
    """Constant-time comparison of a stored signature with the expected one; anything that is
    not a string (or not ASCII, which ``compare_digest`` refuses on str) does not match."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def handler_signature(secret: str, table: str, job: str, handler: str) -> str:
    """The signature of job ``table.job``'s declared handler spec ``handler``."""
    return sign(secret, "krablet-handler", table, job, handler)


def verify_handler(secret: str | None, table: str, job: str, handler: str, signature: Any) -> None:
    """Return if ``signature`` is the cluster's signature of this handler; else a one-line
    UserError naming the fix. Nothing is imported either way."""
    name = f"{table}.{job}"
    if not usable_secret(secret):
        raise UserError(
            f"cannot verify job {name}'s declared handler {handler!r} without the cluster "
            "secret: use the cluster file written by `krea2 krablet up` (or set KRABLET_SECRET "
            "with a DSN list), or pass --handler MODULE:FUNCTION"
        )
    expected = handler_signature(secret or "", table, job, handler)
    if not signature_matches(expected, signature):
        raise UserError(
            f"refusing job {name}'s declared handler {handler!r}: the catalog entry is not "
            "signed with this cluster's secret (changed in the database, or declared by an "
            "older krablet or with another secret); nothing was imported. Pass --handler "
            "MODULE:FUNCTION, or declare the table again with the workers' secret, which signs "
            "it: Warehouse.open(CLUSTER_FILE, tables=[...]) (with a DSN list, the same "
            "KRABLET_SECRET where you declare and where workers run)"
        )
