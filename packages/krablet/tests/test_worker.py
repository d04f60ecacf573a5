"""Workers: DAGs in-process; real CLI workers under SIGTERM, SIGKILL and a Postgres restart."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from krea2.infra.pause import pause_env, wait_for_pause
from krea2.krablet import Job, Table, Warehouse
from krea2.krablet.embedded import start_shard, stop_shard
from krea2.krablet.worker import Worker

sys.path.insert(0, str(Path(__file__).parent))
from handlers import HANDLERS, nums_table

PAUSE = "krablet nums.square"  # the worker's pause point (krea2.krablet.worker)
NUMS = nums_table()


def seed(wh: Warehouse, n: int, start: int = 0) -> None:
    with wh.funnel() as f:
        f.upsert(wh.tables["nums"].name, [{"n": i} for i in range(start, start + n)])


def results(cluster) -> dict[int, int | None]:
    out = {}
    for i in range(len(cluster)):
        with cluster.connect(i) as conn:
            out.update(dict(conn.execute("SELECT n, result FROM nums").fetchall()))
    return out


def spawn(cluster_file: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-c",
        "from krea2.infra.host import main; main()",
        "krablet",
        "worker",
        "--cluster",
        str(cluster_file),
        "--job",
        "nums.square",
        *args,
    ]
    return subprocess.Popen(
        cmd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


class Output:
    """A child's output, read on a thread, so a test can wait for a line while it runs."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._lines: list[str] = []
        self._done = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def wait_for(self, *needles: str, timeout: float = 60) -> None:
        """Block until a line holds one of ``needles``; fail if the output ends first."""

        def seen() -> bool:
            return any(n in line for line in self._lines for n in needles)

        with self._changed:
            self._changed.wait_for(lambda: seen() or self._done, timeout)
            assert seen(), f"no line with {needles}:\n{''.join(self._lines)}"

    def text(self, timeout: float = 30) -> str:
        """All of it, once the child has closed its output."""
        self._reader.join(timeout)
        return "".join(self._lines)


def test_worker_drains_a_dag_and_fails_single_rows(cluster):
    table = Table(
        "images",
        columns={"ocr": "boolean", "emb": "text"},
        jobs=[Job("ocr", result="ocr"), Job("embed", result="emb", where="ocr = FALSE")],
    )
    wh = Warehouse.open(cluster, tables=[table])
    with wh.funnel() as f:
        f.upsert("images", [{"key": f"k{i:03d}"} for i in range(300)])

    def ocr(rows):
        return [
            ValueError("corrupt") if r["key"] == "k007" else {"ocr": r["key"] < "k100"}
            for r in rows
        ]

    stats = Worker(wh, "images", "ocr", ocr, batch_size=16, concurrency=2).run(until_empty=True)
    assert (stats.completed, stats.failed) == (299, 1)
    stats = Worker(
        wh, "images", "embed", lambda rows: [{"emb": "e"} for _ in rows], batch_size=50
    ).run(until_empty=True)
    assert stats.completed == 200  # k100..k299 had ocr = FALSE
    errs = wh.queue("images", "ocr").errors(cluster.shard_of("k007"))
    assert errs[0]["key"] == "k007" and "corrupt" in errs[0]["last_error"]


def test_actor_classes_are_set_up_once_per_slot(cluster1):
    wh = Warehouse.open(cluster1, tables=[NUMS])
    seed(wh, 100)

    class Squarer:
        setups = 0

        def setup(self):
            type(self).setups += 1
            self.k = 1

        def __call__(self, rows):
            return [{"result": r["n"] * r["n"] * self.k} for r in rows]

    Worker(wh, "nums", "square", Squarer, batch_size=10, concurrency=2).run(until_empty=True)
    assert Squarer.setups == 2
    assert results(cluster1)[9] == 81


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_or_releases_claims_and_exits_interrupted(cluster, tmp_path, sig, status):
    wh = Warehouse.open(cluster, tables=[NUMS])
    seed(wh, 400)
    path = cluster.save(tmp_path / "cluster.json")
    notice = tmp_path / "paused"
    env = {"KRABLET_TEST_DELAY": "0.3", **pause_env(PAUSE, 3, notice)}
    proc = spawn(path, "--batch-size", "10", "--concurrency", "2", env=env)
    wait_for_pause(notice, proc, timeout_s=60)  # both slots hold a claimed batch: work left
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == status, out  # 128 + the signal: stopped with work left
    assert "completed" in out
    q = wh.queue("nums", "square")
    assert sum(q.stats(s)["leased"] for s in range(2)) == 0  # nothing stranded
    done = {k: v for k, v in results(cluster).items() if v is not None}
    assert 0 < len(done) < 400
    assert all(v == k * k for k, v in done.items())
    assert sum(q.stats(s)["ready"] for s in range(2)) == 400 - len(done)


def test_sigkilled_workers_lose_nothing_on_a_20000_row_job(cluster, tmp_path):
    wh = Warehouse.open(cluster, tables=[NUMS])
    seed(wh, 20_000)
    path = cluster.save(tmp_path / "cluster.json")
    args = ("--batch-size", "200", "--lease-s", "1.5", "--until-empty")
    env = {"KRABLET_TEST_DELAY": "0.05"}
    rng = random.Random(7)
    spawned = 0

    def start() -> tuple[subprocess.Popen, Path | None]:
        """A worker; the first five hold at a random batch, leases held, to be SIGKILLed."""
        nonlocal spawned
        spawned += 1
        if spawned > 5:
            return spawn(path, *args, env=env), None
        notice = tmp_path / f"paused-{spawned}"
        held = {**env, **pause_env(PAUSE, rng.randrange(1, 6), notice)}
        return spawn(path, *args, env=held), notice

    procs = [start(), start()]
    for kills in range(5):
        victim, notice = procs[kills % 2]  # each held worker is killed: none waits out a pause
        assert notice is not None
        wait_for_pause(notice, victim, timeout_s=60)  # mid-batch: it holds claimed rows
        victim.kill()
        victim.wait()
        procs[kills % 2] = start()
    for p, _ in procs:
        p.communicate(timeout=90)
    res = results(cluster)
    assert len(res) == 20_000
    assert all(v == k * k for k, v in res.items())  # every row done, results unchanged
    q = wh.queue("nums", "square")
    assert all(q.stats(s)["ready"] + q.stats(s)["leased"] == 0 for s in range(2))


@pytest.fixture
def own_server():
    root = Path(tempfile.mkdtemp(prefix="krablet-restart-", dir="/tmp"))
    root.chmod(0o755)
    pgdata = root / "pg"
    dsn = start_shard(pgdata)
    yield pgdata, dsn
    assert stop_shard(pgdata, mode="immediate")
    shutil.rmtree(root, ignore_errors=True)


def test_a_postgres_restart_is_survived_by_workers_and_the_funnel(own_server, tmp_path):
    pgdata, dsn = own_server
    wh = Warehouse.open([dsn], tables=[NUMS])
    seed(wh, 2000)
    path = wh.cluster.save(tmp_path / "cluster.json")
    notice, gate = tmp_path / "paused", tmp_path / "go-on"
    env = {
        "KRABLET_TEST_DELAY": "0.1",
        "KRABLET_TEST_GATE": str(gate),
        "KRABLET_TEST_GATE_AFTER": "3",  # three batches done, the fourth held in the handler
        "KRABLET_TEST_NOTICE": str(notice),
    }
    proc = spawn(path, "--batch-size", "50", "--lease-s", "5", "--until-empty", env=env)
    output = Output(proc)
    funnel = wh.funnel()
    wait_for_pause(notice, proc, timeout_s=60)
    assert proc.poll() is None  # the worker is mid-job when Postgres goes away
    assert stop_shard(pgdata, mode="fast")
    funnel.upsert("nums", [{"n": i} for i in range(2000, 2500)])  # buffered while down
    gate.touch()  # the held batch ends while Postgres is down
    output.wait_for("unreachable", "error connecting")  # it saw the outage: the shard comes back
    start_shard(pgdata)
    funnel.flush(timeout=30)
    funnel.close()
    proc.wait(timeout=90)
    out = output.text()
    assert proc.returncode == 0, out
    assert "unreachable" in out or "error connecting" in out  # it saw the outage, carried on
    if any(v is None for v in results(wh.cluster).values()):  # rows landed after the exit
        Worker(
            wh,
            "nums",
            "square",
            lambda rows: [{"result": r["n"] ** 2} for r in rows],
            batch_size=100,
        ).run(until_empty=True)
    res = results(wh.cluster)
    assert len(res) == 2500 and all(v == k * k for k, v in res.items())
    wh.close()


def test_a_stopped_run_with_work_left_reports_interrupted(cluster1):
    wh = Warehouse.open(cluster1, tables=[NUMS])
    seed(wh, 200)
    w = Worker(wh, "nums", "square", lambda rows: [{"result": 1} for _ in rows], batch_size=10)
    w.stop(signal.SIGTERM)  # before it starts: nothing done, everything left
    stats = w.run()
    assert stats.interrupted and stats.stopped_by == signal.SIGTERM and not stats.finished
    done = Worker(wh, "nums", "square", lambda rows: [{"result": 1} for _ in rows]).run(
        until_empty=True
    )
    assert not done.interrupted and done.finished and done.unreachable_shards == []
    idle = Worker(wh, "nums", "square", lambda rows: [{"result": 1} for _ in rows])
    idle.stop()  # stopped with the queue empty: the job's work is finished
    assert not idle.run().interrupted


def test_a_raising_handler_is_bisected_so_only_the_bad_row_backs_off(cluster1):
    wh = Warehouse.open(cluster1, tables=[NUMS])
    seed(wh, 200)

    def picky(rows):
        if any(r["n"] == 13 for r in rows):
            raise ValueError("cannot square 13")
        return [{"result": r["n"] ** 2} for r in rows]

    stats = Worker(wh, "nums", "square", picky, batch_size=50).run(until_empty=True)
    assert (stats.completed, stats.failed) == (199, 1)
    errs = wh.queue("nums", "square").errors(0)
    assert [(e["key"], e["attempts"]) for e in errs] == [(13, 1)]
    assert "ValueError: cannot square 13" in errs[0]["last_error"]
    res = results(cluster1)
    assert res[13] is None and all(res[n] == n * n for n in range(200) if n != 13)


def test_a_handler_returning_the_wrong_type_is_reported_once(cluster1, caplog):
    wh = Warehouse.open(cluster1, tables=[NUMS])
    seed(wh, 100)
    with caplog.at_level("ERROR", logger="krea2.krablet"):
        stats = Worker(wh, "nums", "square", lambda rows: [1] * len(rows), batch_size=10).run(
            until_empty=True
        )
    assert (stats.completed, stats.failed, stats.batches) == (0, 100, 10)
    said = [r.getMessage() for r in caplog.records if "handler returned int" in r.getMessage()]
    assert len(said) == 1 and "expected a dict" in said[0]
    assert "handler returned int" in wh.queue("nums", "square").errors(0)[0]["last_error"]


def test_until_empty_exits_4_when_rows_failed_and_status_totals_them(cluster, tmp_path):
    wh = Warehouse.open(cluster, tables=[NUMS])
    seed(wh, 200)
    path = cluster.save(tmp_path / "cluster.json")
    proc = spawn(path, "--handler", f"{HANDLERS}:fail_all", "--batch-size", "50", "--until-empty")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 4, out  # the queue is drained, but no row was done
    assert "200 row(s) of nums.square failed" in out and "krablet retry nums.square" in out
    cmd = [sys.executable, "-c", "from krea2.infra.host import main; main()", "krablet"]
    st = subprocess.run([*cmd, "status", "--cluster", str(path)], capture_output=True, text=True)
    assert st.returncode == 0, st.stderr
    assert "failing rows of nums.square: 200 in total" in st.stdout
    as_json = subprocess.run(
        [*cmd, "status", "--cluster", str(path), "--json"], capture_output=True, text=True
    )
    listed = json.loads(as_json.stdout)
    assert listed["failing"] == {"nums.square": 200}
    per_shard = [s["tables"]["nums"]["jobs"]["square"]["failing"] for s in listed["shards"]]
    assert sum(per_shard) == 200 and all(per_shard)


def wait_until_done(cluster, n: int, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Block until the ``n`` rows all hold a result (a state in the warehouse, not a timer)."""
    deadline = time.monotonic() + timeout_s
    while sum(v is not None for v in results(cluster).values()) < n:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the worker did not finish the rows"
        time.sleep(0.05)


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_exits_128_plus_it_even_once_the_work_is_done(cluster, tmp_path, sig, status):
    wh = Warehouse.open(cluster, tables=[NUMS])
    seed(wh, 40)
    path = cluster.save(tmp_path / "cluster.json")
    proc = spawn(path, "--batch-size", "10")  # no --until-empty: it runs until a signal
    wait_until_done(cluster, 40, proc)  # idle now: nothing left to interrupt
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == status, out
    assert "40 completed" in out
