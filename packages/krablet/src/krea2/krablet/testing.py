"""Real PostgreSQL for tests: embedded shards for a session and fresh databases per test.

Shared by the test suites of krablet and of the packages that store in it (curate, rl),
so every suite starts, isolates and stops its servers one way. The pytest plugin that
krablet installs (``krea2.krablet._pytest_plugin``, entry point ``pytest11``) gives every
suite the two fixtures built from these: ``pg_server`` (one embedded server for the
session) and ``cluster_file`` (a fresh one-shard cluster per test).
"""

from __future__ import annotations

import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from krea2.krablet.cluster import Cluster
from krea2.krablet.embedded import start_shard, stop_shard

__all__ = [
    "embedded_servers",
    "fresh_cluster",
    "fresh_cluster_file",
    "fresh_database",
    "with_database",
]


@contextmanager
def embedded_servers(prefix: str, n: int = 1) -> Iterator[list[str]]:
    """``n`` embedded PostgreSQL servers (pgserver) under a new folder in /tmp (readable by
    the ``pgserver`` user); yields their base DSNs (database ``postgres``), stops them at
    exit and deletes their files in the background (not on the test clock)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    shards = [root / f"shard-{i:03d}" for i in range(n)]
    try:
        yield [start_shard(shard) for shard in shards]
    finally:
        for shard in shards:
            stop_shard(shard, mode="immediate")
        subprocess.Popen(["rm", "-rf", str(root)], start_new_session=True)


def with_database(dsn: str, db: str) -> str:
    """``dsn`` pointing at database ``db`` of the same server (its query string kept)."""
    base, _, query = dsn.partition("?")
    return base.rsplit("/", 1)[0] + f"/{db}" + (f"?{query}" if query else "")


def fresh_database(server: str) -> str:
    """The DSN of a new, empty database (a random name) on the server ``server`` points at."""
    import psycopg

    from krea2.krablet.sql import ddl

    db = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(ddl.create_database(db))
    return with_database(server, db)


def fresh_cluster(servers: list[str]) -> Cluster:
    """A cluster of one new, empty database on each of ``servers`` (a server named twice
    holds two shards; a fresh secret): a test never sees another's tables."""
    return Cluster([fresh_database(dsn) for dsn in servers], secret=secrets.token_hex(16))


def fresh_cluster_file(servers: list[str], path: Path) -> Path:
    """:func:`fresh_cluster` saved as a cluster file at ``path``."""
    cluster = fresh_cluster(servers)
    try:
        return cluster.save(path)
    finally:
        cluster.close()
