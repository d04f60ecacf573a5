"""Connections to one shard: a small pool that fails fast while the shard is down.

Every query krablet sends through :meth:`Cluster.connection` gets its connection from the
shard's :class:`ShardPool`. New connections are opened with a short connect timeout
(``connect_timeout_s``, libpq's minimum is 2 s); idle ones are checked with an empty query
before reuse, so a pool survives a Postgres restart. A failed connect, or a connection lost in
the middle of a query, opens the shard's *circuit*: for a backoff that doubles with each
failure (0.25 s up to 4 s, jittered) every call fails at once with :class:`ShardUnavailable`
instead of waiting, then one caller at a time probes the shard again. One dead shard never
makes a caller wait on it for longer than one connect timeout, and the other shards' pools are
untouched.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict

from krea2.infra.errors import UserError

CIRCUIT_BASE_S = 0.25
CIRCUIT_MAX_S = 4.0


def redact(dsn: str) -> str:
    """A DSN with any password removed, safe for logs and error messages."""
    dsn = re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", dsn)
    # a quoted value (libpq: password='a b\' c') is hidden whole, not up to its first space
    value = r"""'(?:[^'\\]|\\.)*'?|\S+"""
    return re.sub(rf"(password\s*=\s*)(?:{value})", r"\1***", dsn, flags=re.IGNORECASE)


def shard_host(dsn: str) -> str:
    """``host:port`` (or the Unix socket directory) a DSN points at; never its password."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return redact(dsn)
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port")
    return f"{host}:{port}" if port else str(host)


class ShardsUnreachable(UserError):
    """Work could not be done because shards are unreachable (the CLI exits with status 3)."""

    exit_code = 3


class ShardUnavailable(ShardsUnreachable):
    """A shard cannot be reached; the message names the shard and its host, never a password."""

    def __init__(self, shard: int, dsn: str, reason: str, hint: str = "") -> None:
        lines = reason.replace(dsn, redact(dsn)).strip().splitlines()
        self.shard = shard
        self.host = shard_host(dsn)
        self.reason = lines[0] if lines else reason
        self.hint = hint
        super().__init__(
            f"shard {shard} ({self.host}) is unreachable: {self.reason} [DSN {redact(dsn)}]"
            + (f"; {hint}" if hint else "")
        )


class ShardPool:
    """Up to ``max_size`` autocommit connections to one shard, behind a circuit breaker.

    ``connect_timeout_s``: the longest a connect may take (seconds, at least 2 in libpq);
    ``wait_s``: how long a caller waits for a free connection of a live but busy shard.
    """

    def __init__(
        self,
        shard: int,
        dsn: str,
        connect_timeout_s: float = 3.0,
        max_size: int = 8,
        wait_s: float = 30.0,
        hint: str = "",
    ) -> None:
        self.shard, self.dsn, self.hint = shard, dsn, hint
        self.connect_timeout_s, self.max_size, self.wait_s = connect_timeout_s, max_size, wait_s
        self.failures = 0  # consecutive failed connects / lost connections
        self.down_since: float | None = None  # monotonic time of the first of those failures
        self.last_error = ""
        self._retry_at = 0.0
        self._probing = False
        self._idle: list[psycopg.Connection] = []
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self._closed = False

    # -- the circuit ------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        """False from a failure until a connection succeeds again."""
        return self.down_since is None

    def down_for(self) -> float:
        """Seconds since the shard was first found unreachable (0.0 while it is up)."""
        since = self.down_since
        return 0.0 if since is None else time.monotonic() - since

    def _admit(self) -> bool:
        """Raise at once while the circuit is open; True if this caller is the probe."""
        with self._lock:
            if self._closed:
                raise ShardUnavailable(
                    self.shard, self.dsn, "its connections are closed", self.hint
                )
            if self.down_since is None:
                return False
            if self._probing or time.monotonic() < self._retry_at:
                raise ShardUnavailable(
                    self.shard,
                    self.dsn,
                    f"{self.last_error} (down for {self.down_for():.1f}s; retrying with backoff)",
                    self.hint,
                )
            self._probing = True
            return True

    def _trip(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            if self.down_since is None:
                self.down_since = time.monotonic()
            backoff = min(CIRCUIT_MAX_S, CIRCUIT_BASE_S * 2 ** (self.failures - 1))
            self._retry_at = time.monotonic() + backoff * random.uniform(0.75, 1.25)
            lines = str(exc).replace(self.dsn, redact(self.dsn)).strip().splitlines()
            self.last_error = lines[0] if lines else type(exc).__name__
            idle, self._idle = self._idle, []
        for conn in idle:  # connections to a server that went away are dead too
            conn.close()

    def _recovered(self) -> None:
        with self._lock:
            self.failures, self.down_since, self.last_error = 0, None, ""

    # -- connections --------------------------------------------------------------------------
    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A connection for one use; raises :class:`ShardUnavailable` fast while down."""
        probe = self._admit()
        try:
            if not self._slots.acquire(timeout=self.wait_s):
                raise ShardUnavailable(
                    self.shard, self.dsn, f"all {self.max_size} connections busy for {self.wait_s}s"
                )  # busy, not down: no hint
            try:
                conn = self._checkout()
            except BaseException:
                self._slots.release()
                raise
        finally:
            if probe:
                with self._lock:
                    self._probing = False
        try:
            yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if conn.closed or conn.broken:  # the server went away mid-query
                self._trip(exc)
                self._return(conn)
                raise ShardUnavailable(self.shard, self.dsn, str(exc), self.hint) from exc
            self._return(conn)
            raise
        except BaseException:
            self._return(conn)
            raise
        else:
            self._return(conn)

    def _checkout(self) -> psycopg.Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open()
            try:
                conn.execute("")  # one round trip: is the server still there?
                return conn
            except psycopg.Error:
                conn.close()

    def _open(self) -> psycopg.Connection:
        try:
            conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=max(2, math.ceil(self.connect_timeout_s)),
            )
        except psycopg.OperationalError as exc:
            self._trip(exc)
            raise ShardUnavailable(self.shard, self.dsn, str(exc), self.hint) from None
        self._recovered()
        return conn

    def _return(self, conn: psycopg.Connection) -> None:
        try:
            reusable = (
                not conn.closed
                and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            )
            with self._lock:
                if reusable and not self._closed and len(self._idle) < self.max_size:
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
