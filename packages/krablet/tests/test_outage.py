"""Shard isolation: a dead shard fails fast, is skipped, and is named; the others keep working."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from krea2.infra.errors import UserError
from krea2.krablet import Cluster, Warehouse, load_cluster
from krea2.krablet.connections import ShardUnavailable
from krea2.krablet.worker import Worker

sys.path.insert(0, str(Path(__file__).parent))  # the worker tests' table and helpers
from test_worker import NUMS, results, seed

DEAD = "postgresql://u:hunter2@127.0.0.1:1/db"  # nothing listens on port 1: refused at once
CLI = [sys.executable, "-c", "from krea2.infra.host import main; main()", "krablet"]


def krablet(*args: str, timeout: float = 25) -> subprocess.CompletedProcess:
    """The CLI; a call that hangs (the old 30 s pool wait) fails the test by its timeout."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def with_dead_shard(cluster: Cluster) -> Cluster:
    """The same cluster with shard 1 replaced by a DSN nobody answers (its data stays put)."""
    return Cluster([cluster.shards[0], DEAD], secret=cluster.secret)


def test_a_dead_shard_fails_fast_names_its_host_and_is_not_retried_during_backoff(monkeypatch):
    c = Cluster([DEAD])
    t0 = time.monotonic()
    with pytest.raises(ShardUnavailable) as first, c.connection(0):
        pass
    assert time.monotonic() - t0 < 10  # a connect timeout at most, never the 30 s pool wait
    message = str(first.value)
    assert "shard 0" in message and "127.0.0.1:1" in message and "hunter2" not in message
    assert not c.is_up(0)
    tries: list[tuple] = []
    connect = psycopg.connect
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: tries.append(a) or connect(*a, **k))
    with pytest.raises(ShardUnavailable, match="retrying with backoff"), c.connection(0):
        pass
    assert tries == []  # the open circuit answers without connecting (not a timing guess)
    c.close()


def test_until_empty_finishes_the_reachable_shard_and_names_the_dead_one(cluster):
    wh = Warehouse.open(cluster, tables=[NUMS])
    seed(wh, 600)
    broken = Warehouse(with_dead_shard(cluster), tables=[NUMS])
    worker = Worker(
        broken,
        "nums",
        "square",
        lambda rows: [{"result": r["n"] ** 2} for r in rows],
        batch_size=50,
        give_up_s=1.0,
    )
    out: list = []
    runner = threading.Thread(target=lambda: out.append(worker.run(until_empty=True)))
    runner.start()
    runner.join(timeout=60)
    assert out, "the worker never finished with one shard dead"
    stats = out[0]
    assert stats.unreachable_shards == [1] and "127.0.0.1:1" in stats.unreachable[0]
    assert not stats.finished and not stats.interrupted
    on_shard0 = [n for n in range(600) if cluster.shard_of(n) == 0]
    assert stats.completed == len(on_shard0)
    res = results(cluster)
    assert all(res[n] == n * n for n in on_shard0)
    assert all(res[n] is None for n in range(600) if cluster.shard_of(n) == 1)
    broken.close()


def test_worker_cli_until_empty_exits_3_naming_the_unreachable_shard(cluster, tmp_path):
    wh = Warehouse.open(cluster, tables=[NUMS])
    seed(wh, 300)
    path = with_dead_shard(cluster).save(tmp_path / "cluster.json")
    run = krablet(
        "worker", "--cluster", str(path), "--job", "nums.square", "--until-empty",
        "--give-up-s", "1", timeout=60,
    )  # fmt: skip
    assert run.returncode == 3, run.stdout + run.stderr
    assert "shard 1 (127.0.0.1:1)" in run.stderr and "hunter2" not in run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    res = results(cluster)
    assert all(res[n] == n * n for n in range(300) if cluster.shard_of(n) == 0)


def test_status_with_a_dead_shard_is_fast_names_it_and_does_not_vouch_for_its_schema(
    cluster, tmp_path
):
    Warehouse.open(cluster, tables=[NUMS]).close()
    path = with_dead_shard(cluster).save(tmp_path / "cluster.json")
    st = krablet("status", "--cluster", str(path))
    assert st.returncode == 3, st.stderr
    assert "shard 1 (127.0.0.1:1)  DOWN" in st.stdout and "hunter2" not in st.stdout
    assert "identical on all shards" not in st.stdout
    assert "not checked on shard(s) 1" in st.stdout and "nums:" in st.stdout
    as_json = json.loads(krablet("status", "--cluster", str(path), "--json").stdout)
    assert as_json["unreachable"] == [1] and as_json["shards"][1]["host"] == "127.0.0.1:1"


def test_a_dead_dsn_fails_fast_with_one_line_naming_shard_and_host():
    for command in (["status"], ["worker", "--job", "nums.square"]):
        run = krablet(*command, "--cluster", DEAD)
        assert run.returncode in (2, 3), run.stderr
        assert "shard 0 (127.0.0.1:1)" in run.stdout + run.stderr, run.stderr
        assert "hunter2" not in run.stdout + run.stderr and "Traceback" not in run.stderr


def test_a_cluster_file_is_validated_when_loaded(tmp_path, monkeypatch):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"shards": [1, 2]}))
    with pytest.raises(UserError, match="shard 0 is 1, not a PostgreSQL DSN"):
        load_cluster(path)
    with pytest.raises(UserError, match=r"shard 1 .* not a valid PostgreSQL DSN"):
        load_cluster("postgresql://h/db,garbage")
    path.write_text(json.dumps({"shards": ["host=h dbname=d"], "connect_timeout_s": "soon"}))
    with pytest.raises(UserError, match="connect_timeout_s must be a number"):
        load_cluster(path)
    path.write_text(json.dumps({"shards": ["host=h dbname=d"], "connect_timeout_s": 5}))
    assert load_cluster(path).connect_timeout_s == 5
    monkeypatch.setenv("KRABLET_CONNECT_TIMEOUT", "2.5")
    assert load_cluster(path).connect_timeout_s == 2.5  # the environment overrides the file
