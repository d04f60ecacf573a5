"""A cluster: an ordered list of shard DSNs, a signing secret, and the stable key → shard map."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import tempfile
import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from krea2.infra.errors import UserError
from krea2.krablet.connections import ShardPool, ShardUnavailable, redact, shard_host

CLUSTER_FILE_VERSION = 1
DEFAULT_CONNECT_TIMEOUT_S = 3.0


def default_connect_timeout() -> float:
    """``$KRABLET_CONNECT_TIMEOUT`` (seconds) or 3 s."""
    raw = os.environ.get("KRABLET_CONNECT_TIMEOUT")
    return DEFAULT_CONNECT_TIMEOUT_S if raw is None else _timeout(raw, "KRABLET_CONNECT_TIMEOUT")


def _timeout(value: Any, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 < seconds <= 3600 or isinstance(value, bool):
        raise UserError(f"{where} must be a number of seconds in (0, 3600], got {value!r}")
    return seconds


def check_dsn(dsn: Any, shard: int, where: str = "cluster") -> str:
    """``dsn`` if it is a libpq connection string or URI; else a UserError naming the shard."""
    if not isinstance(dsn, str) or not dsn.strip():
        raise UserError(
            f"{where}: shard {shard} is {dsn!r}, not a PostgreSQL DSN "
            "(e.g. 'postgresql://user@host:5432/db' or 'host=h dbname=db')"
        )
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise UserError(
            f"{where}: shard {shard} ({redact(dsn)}) is not a valid PostgreSQL DSN: {exc}"
        ) from None
    return dsn


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
    ``krea2 krablet up`` and records their data directories; ``connect_timeout_s`` bounds
    every connect (default ``$KRABLET_CONNECT_TIMEOUT`` or 3 s).
    """

    shards: list[str]
    secret: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    embedded: dict[str, Any] | None = None
    path: Path | None = None
    connect_timeout_s: float = field(default_factory=default_connect_timeout)
    _pools: dict[int, ShardPool] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.shards:
            raise UserError("a cluster needs at least one shard DSN")
        where = f"cluster file {self.path}" if self.path else "cluster"
        for i, dsn in enumerate(self.shards):
            check_dsn(dsn, i, where)
        self.connect_timeout_s = _timeout(self.connect_timeout_s, f"{where}: connect_timeout_s")

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

    @property
    def down_hint(self) -> str:
        """What to do when a shard is down: for shards ``krea2 krablet up`` started, the
        command that starts them again; else "" (a server someone else runs)."""
        data = (self.embedded or {}).get("data")
        if not data:
            return ""
        where = ""
        if self.path and Path(self.path).resolve() != (Path(data) / "cluster.json").resolve():
            where = f" --cluster-file {self.path}"
        return (
            "its shards were started by `krea2 krablet up` and are not running; start them "
            f"again with `krea2 krablet up --data {data}{where}`"
        )

    def describe(self, shard: int) -> str:
        """``shard N (host:port)``: how messages name a shard (never with its password)."""
        return f"shard {shard} ({shard_host(self.shards[shard])})"

    def connect(self, shard: int, **kwargs: Any) -> psycopg.Connection:
        """A new autocommit connection to one shard; the caller closes it."""
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", max(2, math.ceil(self.connect_timeout_s)))
        try:
            return psycopg.connect(self.shards[shard], **kwargs)
        except psycopg.OperationalError as exc:
            raise ShardUnavailable(shard, self.shards[shard], str(exc), self.down_hint) from None

    def connection(self, shard: int) -> AbstractContextManager[psycopg.Connection]:
        """A pooled autocommit connection to one shard, returned to the pool on exit.

        Every query krablet sends to a shard gets its connection here (the funnel's writers and
        migrations hold their own, from :meth:`connect`). While the shard is known to be down
        this raises :class:`ShardUnavailable` at once (see :mod:`krea2.krablet.connections`).
        """
        return self.pool(shard).connection()

    def pool(self, shard: int, max_size: int = 8) -> ShardPool:
        """The shared pool (and circuit breaker) of one shard, created on first use."""
        with self._lock:
            pool = self._pools.get(shard)
            if pool is None:
                pool = ShardPool(
                    shard,
                    self.shards[shard],
                    self.connect_timeout_s,
                    max_size=max_size,
                    hint=self.down_hint,
                )
                self._pools[shard] = pool
            return pool

    def is_up(self, shard: int) -> bool:
        """False while the shard's last connection attempt (or connection) failed."""
        return self.pool(shard).up

    def down_for(self, shard: int) -> float:
        """Seconds the shard has been unreachable without interruption (0.0 while up)."""
        return self.pool(shard).down_for()

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
        if self.connect_timeout_s != DEFAULT_CONNECT_TIMEOUT_S:
            out["connect_timeout_s"] = self.connect_timeout_s
        if self.embedded:
            out["embedded"] = self.embedded
        return out

    def save(self, path: str | Path) -> Path:
        """Write the cluster file atomically, mode 0600 (it holds the secret and maybe
        passwords). The temporary file is a fresh one (``mkstemp``: O_EXCL, 0600), never a
        leftover ``cluster.tmp`` whose mode or symlink target someone else chose."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                os.fchmod(fh.fileno(), 0o600)  # mkstemp's mode already; said so none can widen it
                json.dump(self.to_dict(), fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self.path = path
        return path


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
    if not isinstance(raw.get("secret", ""), str):
        raise UserError(f"cluster file {path}: 'secret' must be a string")
    if raw.get("embedded") is not None and not isinstance(raw["embedded"], dict):
        raise UserError(f"cluster file {path}: 'embedded' must be an object")
    timeout = raw.get("connect_timeout_s")
    if "KRABLET_CONNECT_TIMEOUT" in os.environ or timeout is None:
        timeout = default_connect_timeout()  # the environment overrides the file
    return Cluster(
        raw["shards"],
        secret=raw.get("secret") or "",
        embedded=raw.get("embedded"),
        path=path,
        connect_timeout_s=timeout,
    )


def default_cluster_source(value: str | None) -> str:
    """The ``--cluster`` option's value, falling back to ``$KRABLET_CLUSTER``."""
    value = value or os.environ.get("KRABLET_CLUSTER")
    if not value:
        raise UserError("no cluster given: pass --cluster FILE (or DSNs) or set KRABLET_CLUSTER")
    return value
