"""Shared fixtures: one embedded PostgreSQL for the session, a fresh database per test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def pg_server():
    """One embedded PostgreSQL (pgserver) for the session; each test makes its own database."""
    import shutil
    import tempfile

    from krea2.krablet import start_shard, stop_shard

    root = Path(tempfile.mkdtemp(prefix="rl-test-pg-", dir="/tmp"))
    root.chmod(0o755)
    dsn = start_shard(root / "shard-000")
    yield dsn
    stop_shard(root / "shard-000", mode="immediate")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster_file(pg_server, tmp_path) -> Path:
    """A fresh one-shard krablet cluster (a new database), saved as a cluster file."""
    import secrets

    import psycopg

    from krea2.krablet import Cluster

    db = f"c_{secrets.token_hex(6)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    base, _, query = pg_server.partition("?")
    dsn = base.rsplit("/", 1)[0] + f"/{db}" + (f"?{query}" if query else "")
    cluster = Cluster([dsn], secret=secrets.token_hex(16))
    path = cluster.save(tmp_path / "cluster.json")
    cluster.close()
    return path
