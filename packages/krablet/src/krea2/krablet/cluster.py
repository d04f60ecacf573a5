"""A cluster: an ordered list of shard DSNs, a signing secret, and the stable key → shard map."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from krea2.infra.errors import UserError

CLUSTER_FILE_VERSION = 1


def redact(dsn: str) -> str:
    """A DSN with any password removed, safe for logs and error messages."""
    dsn = re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", dsn, flags=re.IGNORECASE)


def key_hash(key: Any) -> int:
    """Stable 64-bit hash of a key's text form (``12`` and ``"12"`` hash alike)."""
    return int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8).digest(), "big")


def shard_of(key: Any, n_shards: int) -> int:
    """Stable shard index of a primary-key value: its :func:`key_hash` modulo the shard count."""
    return key_hash(key) % n_shards


@dataclass
class Cluster:
    """The shards of one warehouse. Load one with :func:`load_cluster`.

    ``shards`` are libpq DSNs in a fixed order (the order defines placement, never reorder it);
    ``secret`` signs pluck jobs; ``embedded`` is set when the shards were started by
    ``krea2 krablet up`` and records their data directories.
    """

    shards: list[str]
    secret: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    embedded: dict[str, Any] | None = None
    path: Path | None = None
    _pools: dict[int, ConnectionPool] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.shards:
            raise UserError("a cluster needs at least one shard DSN")

    def __len__(self) -> int:
        return len(self.shards)

    def __repr__(self) -> str:
        return f"Cluster({len(self.shards)} shards: {', '.join(redact(d) for d in self.shards)})"

    def shard_of(self, key: Any) -> int:
        return shard_of(key, len(self.shards))

    def split(self, keys: Iterable[Any]) -> dict[int, list[Any]]:
        """Keys grouped by shard index."""
        out: dict[int, list[Any]] = {}
        for key in keys:
            out.setdefault(self.shard_of(key), []).append(key)
        return out

    def connect(self, shard: int, **kwargs: Any) -> psycopg.Connection:
        """A new autocommit connection to one shard; the caller closes it."""
        kwargs.setdefault("autocommit", True)
        try:
            return psycopg.connect(self.shards[shard], **kwargs)
        except psycopg.OperationalError as exc:
            raise ShardUnavailable(shard, self.shards[shard], exc) from None

    def connection(self, shard: int) -> AbstractContextManager[psycopg.Connection]:
        """A pooled autocommit connection to one shard, returned to the pool on exit.

        Every query krablet sends to a shard gets its connection here (the funnel's writers and
        migrations hold their own, from :meth:`connect`).
        """
        return self.pool(shard).connection()

    def pool(self, shard: int, max_size: int = 8) -> ConnectionPool:
        """A shared, lazily opened connection pool for one shard (autocommit connections).

        Connections are checked before they are handed out, so a pool survives a Postgres restart.
        """
        with self._lock:
            pool = self._pools.get(shard)
            if pool is None:
                pool = ConnectionPool(
                    self.shards[shard],
                    min_size=0,
                    max_size=max_size,
                    open=True,
                    kwargs={"autocommit": True},
                    check=ConnectionPool.check_connection,
                    name=f"krablet-shard-{shard}",
                    timeout=30,
                )
                self._pools[shard] = pool
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": CLUSTER_FILE_VERSION,
            "shards": self.shards,
            "secret": self.secret,
        }
        if self.embedded:
            out["embedded"] = self.embedded
        return out

    def save(self, path: str | Path) -> Path:
        """Write the cluster file (mode 0600: it holds the secret and maybe passwords)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2)
        os.replace(tmp, path)
        self.path = path
        return path


class ShardUnavailable(UserError):
    """A shard refused the connection; the message names the shard, never its password."""

    def __init__(self, shard: int, dsn: str, exc: Exception) -> None:
        reason = str(exc).replace(dsn, redact(dsn)).strip().splitlines()
        super().__init__(
            f"shard {shard} ({redact(dsn)}) is unavailable: {reason[0] if reason else exc}"
        )


def load_cluster(source: str | Path | Sequence[str] | Cluster) -> Cluster:
    """A cluster from a cluster file, a comma-separated DSN list, a list of DSNs, or a Cluster.

    The environment variable ``KRABLET_CLUSTER`` names the default cluster file.
    """
    if isinstance(source, Cluster):
        return source
    if isinstance(source, (list, tuple)):
        return Cluster(
            list(source), secret=os.environ.get("KRABLET_SECRET") or secrets.token_hex(32)
        )
    text = str(source)
    if text.startswith(("postgresql://", "postgres://")) or (
        "=" in text and not Path(text).exists()
    ):
        dsns = [d.strip() for d in text.split(",") if d.strip()]
        return Cluster(dsns, secret=os.environ.get("KRABLET_SECRET") or secrets.token_hex(32))
    path = Path(text)
    if not path.exists():
        raise UserError(
            f"cluster file {path} does not exist; create one with"
            " `krea2 krablet up --shards 2 --data DIR`"
            " or pass DSNs separated by commas"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"cluster file {path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("shards"), list):
        raise UserError(f"cluster file {path} has no 'shards' list")
    return Cluster(
        [str(d) for d in raw["shards"]],
        secret=str(raw.get("secret") or ""),
        embedded=raw.get("embedded"),
        path=path,
    )


def default_cluster_source(value: str | None) -> str:
    """The ``--cluster`` option's value, falling back to ``$KRABLET_CLUSTER``."""
    value = value or os.environ.get("KRABLET_CLUSTER")
    if not value:
        raise UserError("no cluster given: pass --cluster FILE (or DSNs) or set KRABLET_CLUSTER")
    return value
