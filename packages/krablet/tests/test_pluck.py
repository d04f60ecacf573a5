"""pluck end to end: 2 shards, 2 worker processes, live progress, and unsigned jobs refused."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import pytest
from rich.console import Console

from krea2.infra.errors import UserError
from krea2.krablet import PluckTable, PluckWorker, Table, Warehouse

PICS = Table(
    "pics",
    key="pic",
    key_type="bigint",
    columns={"w": "integer", "area": "bigint", "label": "text"},
)


def area(rows):
    return [{"area": r["w"] * r["w"]} for r in rows]


class Labeler:
    def setup(self):
        self.prefix = "big"

    def __call__(self, rows):
        return [{"label": self.prefix} if r["w"] > 50 else None for r in rows]


def workers(path, n=2):
    cmd = [
        sys.executable,
        "-c",
        "from krea2.infra.host import main; main()",
        "krablet",
        "worker",
        "--pluck",
        "--until-empty",
        "--cluster",
        str(path),
    ]
    return [
        subprocess.Popen(
            cmd, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(n)
    ]


def test_pluck_maps_over_two_shards_with_two_workers_and_refuses_unsigned_jobs(cluster, tmp_path):
    wh = Warehouse.open(cluster, tables=[PICS])
    with wh.funnel() as f:
        f.upsert("pics", [{"pic": i, "w": i % 100} for i in range(6000)])
    for i in range(2):
        with cluster.connect(i) as conn:
            conn.execute("ANALYZE pics")
    path = cluster.save(tmp_path / "cluster.json")
    t = PluckTable("pics", key="pic", where="area IS NULL", cluster=wh)
    h = t.map(area, batch_size=100, rows_per_task=300)
    h2 = PluckTable("pics", key="pic", cluster=wh).map(Labeler, batch_size=200)
    # a job signed with another secret, as if injected by someone without the cluster file
    other = type(cluster)(cluster.shards, secret="a-different-secret-0123456789")
    forged = Warehouse(other, wh.tables.values())
    bad = PluckTable("pics", key="pic", cluster=forged).map(lambda rows: 1 / 0)
    assert h.progress().tasks > 4  # the keyspace was split into several ranges per shard
    procs = workers(path)
    buf = io.StringIO()
    final = h.attach(
        console=Console(file=buf, width=120, force_terminal=False), poll_s=0.2, timeout=120
    )
    assert final.finished and final.rows == 6000
    assert "6000 rows" in buf.getvalue()
    assert h2.wait(timeout=60).finished
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    res = wh.reader().scan("pics", columns=["w", "area", "label"], limit=10_000)[0]
    assert all(r["area"] == r["w"] ** 2 for r in res)
    assert all((r["label"] == "big") == (r["w"] > 50) for r in res)
    errs = bad.errors()
    assert errs and all("refused" in e["last_error"] for e in errs)
    assert not bad.progress().finished
    bad.cancel()
    assert bad.wait(timeout=5).status == "cancelled"


def test_pluck_refuses_to_sign_or_run_without_a_real_secret(cluster):
    wh = Warehouse(type(cluster)(cluster.shards, secret=""), [PICS])
    with pytest.raises(UserError, match="secret"):
        PluckTable("pics", cluster=wh).map(area)
    with pytest.raises(UserError, match="secret"):
        PluckWorker(wh)


def no_luck(rows):
    raise RuntimeError("no luck")


def test_a_failing_map_backs_off_through_the_queue_with_jitter(cluster1):
    wh = Warehouse.open(cluster1, tables=[PICS])
    with wh.funnel() as f:
        f.upsert("pics", [{"pic": i, "w": i} for i in range(400)])
    h = PluckTable("pics", cluster=wh).map(no_luck, batch_size=10, rows_per_task=20)
    stats = PluckWorker(wh, concurrency=2).run(until_empty=True)
    p = h.progress()
    assert p.tasks >= 10 and p.done == 0 and p.failing == p.tasks
    assert stats.failed >= p.tasks and stats.completed == 0
    # the ranges are an ordinary job: its queue holds them, backing off
    assert wh.queue("krablet_pluck_ranges", "run").stats(0)["backing_off"] == p.tasks
    assert all("no luck" in e["last_error"] for e in h.errors())
    with cluster1.connect(0) as conn:
        delays = [
            r[0]
            for r in conn.execute(
                'SELECT extract(epoch FROM next_try_at - now()) FROM "_kq_krablet_pluck_ranges_run"'
            )
        ]
    assert all(2.5 < d < 6.3 for d in delays)  # the job's 5 s backoff, ±25 % jitter
    assert len({round(d, 3) for d in delays}) > 1  # jittered, not in lockstep


def test_a_cancelled_map_leaves_the_queue_and_its_rows_untouched(cluster1):
    wh = Warehouse.open(cluster1, tables=[PICS])
    with wh.funnel() as f:
        f.upsert("pics", [{"pic": i, "w": i} for i in range(100)])
    h = PluckTable("pics", cluster=wh).map(area, batch_size=10, rows_per_task=20)
    h.cancel()
    stats = PluckWorker(wh).run(until_empty=True)
    assert stats.completed == 0 and h.progress().status == "cancelled"
    st = wh.queue("krablet_pluck_ranges", "run").stats(0)
    assert st["ready"] == 0 and st["leased"] == 0  # the claim dropped the cancelled ranges
    assert wh.reader().count("pics", where=[("area", "is not", None)]) == 0


def test_a_sigterm_stops_a_pluck_worker_with_143(cluster1, tmp_path):
    wh = Warehouse.open(cluster1, tables=[PICS])
    with wh.funnel() as f:
        f.upsert("pics", [{"pic": i, "w": i} for i in range(50)])
    path = cluster1.save(tmp_path / "cluster.json")
    h = PluckTable("pics", cluster=wh).map(area, batch_size=10)
    cmd = [sys.executable, "-c", "from krea2.infra.host import main; main()", "krablet"]
    proc = subprocess.Popen(
        [*cmd, "worker", "--pluck", "--cluster", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert h.wait(timeout=60).finished  # the worker is running: it did the map
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    assert "Traceback" not in out and "1 ranges completed" in out
