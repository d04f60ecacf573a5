"""krablet's pytest plugin (entry point ``pytest11``): real PostgreSQL for any test suite.

``pg_server``: one embedded PostgreSQL (pgserver) for the session, its base DSN; each test
makes its own database. ``cluster_file``: a fresh one-shard krablet cluster (a new database
on that server, a fresh secret), saved as a cluster file in the test's ``tmp_path``. A suite's
own ``conftest.py`` fixtures of the same names take precedence. Private (``_``): it imports
pytest, which a plain install of krablet does not have; pytest loads it, nothing else does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One embedded PostgreSQL for the session; each test makes its own database."""
    from krea2.krablet.testing import embedded_servers

    with embedded_servers("krea2-test-pg-") as (dsn,):
        yield dsn


@pytest.fixture
def cluster_file(pg_server: str, tmp_path: Path) -> Path:
    """A fresh one-shard krablet cluster (a new database), saved as a cluster file."""
    from krea2.krablet.testing import fresh_cluster_file

    return fresh_cluster_file([pg_server], tmp_path / "cluster.json")
