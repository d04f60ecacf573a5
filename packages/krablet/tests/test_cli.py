"""The command line: `up` writes a reusable cluster file, `status` reports, errors are one line."""

from __future__ import annotations

import json
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
