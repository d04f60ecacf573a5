"""Real PostgreSQL for krablet's tests: three embedded pgserver shards for the whole session.

Each test gets fresh databases (one per shard) so tests never see each other's tables, and
nothing depends on a system Postgres service.
"""

from __future__ import annotations

import pytest

from krea2.krablet.cluster import Cluster
from krea2.krablet.testing import embedded_servers, fresh_cluster

N_SHARDS = 3


@pytest.fixture(scope="session")
def pg_servers() -> list[str]:
    """Base DSNs (database ``postgres``) of the session's shards."""
    with embedded_servers("krablet-test-", N_SHARDS) as dsns:
        yield dsns


def make_cluster(pg_servers: list[str], n: int) -> Cluster:
    return fresh_cluster(pg_servers[:n])


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
