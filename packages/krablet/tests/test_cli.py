"""The command line: `up` writes a reusable cluster file, `status` reports, errors are one line."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from krea2.krablet import Job, Table, Warehouse
from krea2.krablet.embedded import down

CLI = [sys.executable, "-c", "from krea2.infra.host import main; main()", "krablet"]


def krablet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def data_dir():
    root = Path(tempfile.mkdtemp(prefix="krablet-cli-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    down(root)
    shutil.rmtree(root, ignore_errors=True)


def test_up_status_and_a_second_up_keep_the_cluster(data_dir):
    first = krablet("up", "--shards", "1", "--data", str(data_dir))
    assert first.returncode == 0, first.stderr
    path = data_dir / "cluster.json"
    spec = json.loads(path.read_text())
    assert len(spec["shards"]) == 1 and (path.stat().st_mode & 0o077) == 0
    wh = Warehouse.open(
        str(path), tables=[Table("t", columns={"x": "text"}, jobs=[Job("j", result="x")])]
    )
    with wh.funnel() as f:
        f.upsert("t", [{"key": "a"}, {"key": "b"}])
    wh.close()
    st = krablet("status", "--cluster", str(path))
    assert st.returncode == 0, st.stderr
    assert "t: 2 rows" in st.stdout and "job j: ready 2" in st.stdout
    assert "identical on all shards" in st.stdout
    again = krablet("up", "--shards", "1", "--data", str(data_dir))
    assert again.returncode == 0
    assert json.loads(path.read_text())["secret"] == spec["secret"]
    changed = krablet("up", "--shards", "3", "--data", str(data_dir))
    assert changed.returncode == 2 and "cannot change" in changed.stderr


def test_mistakes_print_one_clear_line(tmp_path):
    missing = krablet("status", "--cluster", str(tmp_path / "nope.json"))
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr and "Traceback" not in missing.stderr


def test_status_shows_attempts_and_errors_and_retry_resets_chosen_rows(data_dir):
    assert krablet("up", "--shards", "1", "--data", str(data_dir)).returncode == 0
    path = str(data_dir / "cluster.json")
    table = Table("t", columns={"x": "text"}, jobs=[Job("j", result="x", backoff_s=600)])
    wh = Warehouse.open(path, tables=[table])
    with wh.funnel() as f:
        f.upsert("t", [{"key": "a"}, {"key": "b"}, {"key": "c"}])
    q = wh.queue("t", "j")
    claim = q.claim(0, 3)
    q.fail(claim, {"a": "ValueError: bad pixels", "b": "OSError: gone"})
    st = krablet("status", "--cluster", path)
    assert st.returncode == 0, st.stderr
    assert "a: 1 attempt(s), next try in" in st.stdout and "ValueError: bad pixels" in st.stdout
    errors = json.loads(krablet("status", "--cluster", path, "--json").stdout)["shards"][0]
    listed = errors["tables"]["t"]["jobs"]["j"]["errors"]
    assert {(e["key"], e["attempts"]) for e in listed} == {("a", 1), ("b", 1)}
    assert krablet("retry", "t.j", "--cluster", path).returncode == 2  # rows must be chosen
    again = krablet("retry", "t.j", "--where", "key = 'a'", "--cluster", path)
    assert again.returncode == 0 and "1 row(s) of t.j ready again" in again.stdout
    assert q.claim(0, 3).keys == ["a"]  # b still backs off, c is still leased
    bad = krablet("retry", "t.j", "--where", "nope = 1", "--cluster", path)
    assert bad.returncode == 2 and "not valid SQL" in bad.stderr
    wh.close()


def test_down_and_up_one_shard(data_dir):
    assert krablet("up", "--shards", "2", "--data", str(data_dir)).returncode == 0
    path = str(data_dir / "cluster.json")
    stopped = krablet("down", "--data", str(data_dir), "--shard", "1")
    assert stopped.returncode == 0 and "stopped shard 1" in stopped.stdout
    st = krablet("status", "--cluster", path)
    assert st.returncode == 3 and "shard 1" in st.stdout and "DOWN" in st.stdout
    assert "shard 0" in st.stdout and st.stdout.count("DOWN") == 1
    assert krablet("up", "--data", str(data_dir), "--shard", "1").returncode == 0
    assert krablet("status", "--cluster", path).returncode == 0
    assert krablet("down", "--data", str(data_dir), "--shard", "5").returncode == 2


def test_a_stopped_embedded_warehouse_says_how_to_start_it(data_dir):
    from krea2.krablet import load_cluster
    from krea2.krablet.connections import ShardUnavailable

    assert krablet("up", "--shards", "1", "--data", str(data_dir)).returncode == 0
    path = data_dir / "cluster.json"
    assert krablet("down", "--data", str(data_dir)).returncode == 0
    fix = f"krea2 krablet up --data {data_dir.resolve()}"
    cluster = load_cluster(path)
    with pytest.raises(ShardUnavailable, match="started by `krea2 krablet up`") as err:
        cluster.connect(0)
    assert fix in str(err.value)
    with pytest.raises(ShardUnavailable) as err, cluster.connection(0):
        pass  # the pooled path says the same
    assert fix in str(err.value)
    cluster.close()
    retry = krablet("retry", "t.j", "--all", "--yes", "--cluster", str(path))
    assert retry.returncode == 3 and fix in retry.stderr, retry.stderr
    assert "Traceback" not in retry.stderr


def done_table(cluster, tmp_path) -> tuple[Warehouse, str]:
    """Table t: rows a, b, c done by job j (x = 'old'), d failed once; the cluster file."""
    table = Table("t", columns={"x": "text"}, jobs=[Job("j", result="x", backoff_s=600)])
    wh = Warehouse.open(cluster, tables=[table])
    with wh.funnel() as f:
        f.upsert("t", [{"key": k} for k in "abcd"])
    q = wh.queue("t", "j")
    claim = q.claim(0, 4)
    q.complete(claim, {k: {"x": "old"} for k in "abc"})
    q.fail(claim, {"d": "OSError: gone"})
    return wh, str(cluster.save(tmp_path / "cluster.json"))


def xs(wh: Warehouse) -> dict[str, str | None]:
    return {k: r["x"] for k, r in wh.reader().get("t", list("abcd")).items()}


def test_retry_runs_done_rows_again_only_with_yes_in_a_script(cluster1, tmp_path):
    wh, path = done_table(cluster1, tmp_path)
    q = wh.queue("t", "j")
    asked = krablet("retry", "t.j", "--all", "--cluster", path)  # a script: no one to ask
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "3 row(s) of t.j are done" in asked.stderr and "pass --yes" in asked.stderr
    assert "1 row(s) of t.j ready again" in asked.stdout  # the failed row, as before
    assert xs(wh) == {"a": "old", "b": "old", "c": "old", "d": None}  # done rows kept
    assert q.claim(0, 4).keys == ["d"]
    redo = krablet("retry", "t.j", "--where", "key IN ('a', 'd')", "--yes", "--cluster", path)
    assert redo.returncode == 0, redo.stderr
    assert "0 failed or waiting row(s) ready again, 1 done row(s) cleared" in redo.stdout
    assert "1 row(s) of t.j ready again" in redo.stdout  # d is leased: left to its holder
    assert xs(wh) == {"a": None, "b": "old", "c": "old", "d": None}
    again = q.claim(0, 4)
    assert again.keys == ["a"] and again.attempts == {"a": 1}
    wh.close()


@pytest.mark.parametrize(("answer", "expected"), [("y", None), ("n", "old")])
def test_retry_asks_before_clearing_done_rows_at_a_terminal(cluster1, tmp_path, answer, expected):
    wh, path = done_table(cluster1, tmp_path)
    leader, terminal = pty.openpty()
    os.write(leader, f"{answer}\n".encode())  # typed ahead: the terminal holds it for the prompt
    run = subprocess.run(
        [*CLI, "retry", "t.j", "--where", "key = 'b'", "--cluster", path],
        stdin=terminal,
        capture_output=True,
        text=True,
        timeout=120,
    )
    os.close(terminal)
    os.close(leader)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 row(s) of t.j are done and match" in run.stdout
    assert xs(wh)["b"] == expected
    wh.close()
