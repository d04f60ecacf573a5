"""Shared fixtures: one embedded PostgreSQL for the session, a fresh database per test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def pg_server():
    """One embedded PostgreSQL (pgserver) for the session; each test makes its own database."""
    from krea2.krablet.testing import embedded_servers

    with embedded_servers("rl-test-pg-") as (dsn,):
        yield dsn


@pytest.fixture
def cluster_file(pg_server, tmp_path) -> Path:
    """A fresh one-shard krablet cluster (a new database), saved as a cluster file."""
    from krea2.krablet.testing import fresh_cluster_file

    return fresh_cluster_file([pg_server], tmp_path / "cluster.json")
