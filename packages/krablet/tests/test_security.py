"""Code and secrets at rest: workers import only handlers signed with the cluster secret, and
the cluster file is private whatever was lying next to it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from krea2.krablet import Cluster, Job, Table, Warehouse

sys.path.insert(0, str(Path(__file__).parent))
from handlers import nums_table

NUMS = nums_table()
CLI = [sys.executable, "-c", "from krea2.infra.host import main; main()", "krablet"]


def worker(path: Path) -> subprocess.CompletedProcess:
    """A CLI worker of nums.square with no --handler: it uses the job's declared handler."""
    cmd = [*CLI, "worker", "--cluster", str(path), "--job", "nums.square", "--until-empty"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def planted_module(tmp_path: Path) -> tuple[str, Path]:
    """A handler file that leaves a marker the moment it is imported."""
    marker = tmp_path / "imported"
    evil = tmp_path / "planted.py"
    evil.write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "def run(rows):\n    return [{'result': -1} for _ in rows]\n"
    )
    return f"{evil}:run", marker


def point_catalog_at(cluster: Cluster, spec: str) -> None:
    """What one SQL UPDATE by someone without the cluster secret can do: name other code."""
    for i in range(len(cluster)):
        with cluster.connect(i) as conn:
            conn.execute(
                "UPDATE krablet_catalog SET spec = jsonb_set(spec, '{jobs,0,handler}', "
                "to_jsonb(%s::text)) WHERE name = 'nums'",
                (spec,),
            )


def declare_with_another_secret(cluster: Cluster, spec: str) -> None:
    """A declaration signed, but with a secret that is not this cluster's."""
    other = Cluster(cluster.shards, secret="another-secret-0123456789abcdef")
    planted = Table(
        "nums",
        key="n",
        key_type="bigint",
        columns={"result": "bigint"},
        jobs=[Job("square", result="result", handler=spec)],
    )
    Warehouse.open(other, tables=[planted]).close()


def forge_a_signature(cluster: Cluster, spec: str) -> None:
    """Name other code and write a made-up signature for it (not even ASCII)."""
    point_catalog_at(cluster, spec)
    for i in range(len(cluster)):
        with cluster.connect(i) as conn:
            conn.execute(
                "UPDATE krablet_catalog SET spec = jsonb_set(spec, '{signed_handlers,square}', "
                "to_jsonb(%s::text)) WHERE name = 'nums'",
                ("é" * 64,),
            )


@pytest.mark.parametrize(
    "tamper", [point_catalog_at, declare_with_another_secret, forge_a_signature]
)
def test_a_worker_imports_no_handler_the_cluster_secret_did_not_sign(cluster, tmp_path, tamper):
    wh = Warehouse.open(cluster, tables=[NUMS])
    with wh.funnel() as f:
        f.upsert("nums", [{"n": i} for i in range(50)])
    path = cluster.save(tmp_path / "cluster.json")
    spec, marker = planted_module(tmp_path)
    tamper(cluster, spec)
    refused = worker(path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert not marker.exists()  # the planted file was never imported
    assert "refusing job nums.square's declared handler" in refused.stderr
    assert "--handler" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert wh.reader().count("nums", where=[("result", "is not", None)]) == 0
    # the fix the message names: declare the table again with the cluster file's secret
    Warehouse.open(path, tables=[NUMS]).close()
    fixed = worker(path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert not marker.exists()
    assert wh.reader().count("nums", where=[("result", "is not", None)]) == 50
    wh.close()


def test_a_declared_handler_needs_the_secret_to_be_verified(cluster, tmp_path):
    Warehouse.open(cluster, tables=[NUMS]).close()
    dsns = ",".join(cluster.shards)  # a DSN list carries no secret
    cmd = [*CLI, "worker", "--cluster", dsns, "--job", "nums.square", "--until-empty"]
    env = {k: v for k, v in os.environ.items() if k != "KRABLET_SECRET"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2 and "refusing job nums.square" in run.stderr, run.stderr
    env["KRABLET_SECRET"] = cluster.secret  # the same secret everywhere: verified, and it runs
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_cluster_file_is_private_even_over_a_leftover_temporary_file(tmp_path):
    cluster = Cluster(["postgresql://u:pw@127.0.0.1:1/db"])
    path = tmp_path / "cluster.json"
    leftover = tmp_path / "cluster.tmp"  # the temporary name older saves wrote through
    leftover.write_text("{}")
    leftover.chmod(0o644)
    cluster.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert leftover.read_text() == "{}"  # a fresh temporary file was used, not this one
    path.chmod(0o644)
    cluster.save(path)  # saving again replaces the file: the new one is private again
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json", "cluster.tmp"]


def test_saving_the_cluster_file_never_writes_through_a_planted_link(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    (tmp_path / "cluster.tmp").symlink_to(elsewhere)
    Cluster(["postgresql://u:pw@127.0.0.1:1/db"]).save(tmp_path / "cluster.json")
    assert not elsewhere.exists()
    assert (tmp_path / "cluster.json").stat().st_mode & 0o777 == 0o600
