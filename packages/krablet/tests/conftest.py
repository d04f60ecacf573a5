"""Real PostgreSQL for krablet's tests: three embedded pgserver shards for the whole session.

Each test gets fresh databases (one per shard) so tests never see each other's tables, and
nothing depends on a system Postgres service.
"""

from __future__ import annotations

import secrets
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from krea2.krablet.cluster import Cluster
from krea2.krablet.embedded import start_shard, stop_shard

N_SHARDS = 3


@pytest.fixture(scope="session")
def pg_root():
    root = Path(tempfile.mkdtemp(prefix="krablet-test-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    for i in range(N_SHARDS):
        stop_shard(root / f"shard-{i:03d}", mode="immediate")
    # hundreds of small test databases: delete them in the background, not on the test clock
    subprocess.Popen(["rm", "-rf", str(root)], start_new_session=True)


@pytest.fixture(scope="session")
def pg_servers(pg_root) -> list[str]:
    """Base DSNs (database ``postgres``) of the session's shards."""
    return [start_shard(pg_root / f"shard-{i:03d}") for i in range(N_SHARDS)]


def _with_db(dsn: str, db: str) -> str:
    base, _, query = dsn.partition("?")
    return base.rsplit("/", 1)[0] + f"/{db}" + (f"?{query}" if query else "")


def make_cluster(pg_servers: list[str], n: int) -> Cluster:
    db = f"t_{secrets.token_hex(6)}"
    dsns = []
    for dsn in pg_servers[:n]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db}"')
        dsns.append(_with_db(dsn, db))
    return Cluster(dsns, secret=secrets.token_hex(16))


@pytest.fixture
def cluster_factory(pg_servers):
    """``cluster_factory(n)``: a fresh n-shard cluster, closed after the test."""
    made: list[Cluster] = []

    def factory(n: int = 2) -> Cluster:
        made.append(make_cluster(pg_servers, n))
        return made[-1]

    yield factory
    for c in made:
        c.close()


@pytest.fixture
def cluster(cluster_factory) -> Cluster:
    """Two shards, empty databases."""
    return cluster_factory(2)


@pytest.fixture
def cluster1(cluster_factory) -> Cluster:
    return cluster_factory(1)


@pytest.fixture
def cluster3(cluster_factory) -> Cluster:
    return cluster_factory(3)
