"""Chaos: CLI workers SIGKILLed and replaced while one of two shards goes down and comes back.

Two embedded shards, a job over ``--rows`` rows, ``--workers`` real ``krea2 krablet worker
--until-empty`` processes. For ``--chaos-s`` seconds one worker (round robin) is SIGKILLed every
``--kill-every-s`` seconds and replaced at once; ``--outage-at-s`` after the first result,
shard 1 is stopped (pg_ctl fast) and started again ``--outage-s`` later. Then the workers
finish the job.

A row trigger on each shard logs every write of a result (key, clock time), so the run checks:
every row done with the right value (zero lost), exactly one result write per row (zero double
writes), and the healthy shard's completion rate during the outage against the same length of
time just before it. It also times how long a killed worker's leased rows waited before they
were done (lease expiry, then the ready backlog ahead of them: retry-at-end).

    uv run --frozen python -m benchmarks.chaos            # full run, writes the chaos section
    uv run --frozen python -m benchmarks.chaos --rows 2000 --chaos-s 15 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from krea2.krablet import Job, Table, Warehouse, start_shard, stop_shard

# benchmarks.report is imported only where it is used: the krablet tests and workers load this
# file by path and need not have the repo root on sys.path.

HERE = Path(__file__).resolve()
TABLE = Table(
    "chaos",
    key="n",
    key_type="bigint",
    columns={"result": "bigint"},
    jobs=[Job("square", result="result", inputs=[])],
)
AUDIT = """
CREATE TABLE IF NOT EXISTS chaos_writes (n bigint, at timestamptz DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO chaos_writes (n) VALUES (NEW.n); RETURN NULL; END $$;
DROP TRIGGER IF EXISTS chaos_audit ON chaos;
CREATE TRIGGER chaos_audit AFTER UPDATE ON chaos FOR EACH ROW
    WHEN (NEW.result IS NOT NULL) EXECUTE FUNCTION chaos_audit();
"""


def square(rows: list[dict]) -> list[dict]:
    """The workers' handler: n² after ``$CHAOS_DELAY`` seconds per batch."""
    time.sleep(float(os.environ.get("CHAOS_DELAY", "0")))
    return [{"result": r["n"] * r["n"]} for r in rows]


def _query(dsn: str, sql: str, params: Any = None) -> list[tuple]:
    """Rows of one query, or [] if the shard is down."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            return conn.execute(sql, params).fetchall()
    except psycopg.OperationalError:
        return []


class Workers:
    """``n`` CLI workers; :meth:`kill` SIGKILLs one and starts its replacement at once."""

    def __init__(self, n: int, cluster_file: Path, logs: Path, args: list[str], env: dict):
        self.cmd = [
            sys.executable, "-c", "from krea2.infra.host import main; main()", "krablet",
            "worker", "--cluster", str(cluster_file), "--job", "chaos.square",
            "--handler", f"{HERE}:square", "--until-empty", *args,
        ]  # fmt: skip
        self.logs, self.env, self.started = logs, {**os.environ, **env}, 0
        self.procs = [self._spawn() for _ in range(n)]
        self.killed: list[subprocess.Popen] = []

    def _spawn(self) -> subprocess.Popen:
        self.started += 1
        out = (self.logs / f"worker-{self.started:03d}.log").open("w")
        return subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def kill(self, i: int) -> int:
        victim = self.procs[i]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.killed.append(victim)
        self.procs[i] = self._spawn()
        return victim.pid

    def wait(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        return [p.returncode for p in self.procs]


def _rate(times: list[float], start: float, end: float) -> float:
    return sum(start <= t < end for t in times) / max(end - start, 1e-9)


def run(
    rows: int = 12_000,
    workers: int = 4,
    kill_every_s: float = 2.0,
    chaos_s: float = 60.0,
    outage_at_s: float = 20.0,
    outage_s: float = 10.0,
    batch_size: int = 20,
    delay_s: float = 0.4,
    lease_s: float = 3.0,
    finish_timeout_s: float = 300.0,
    say=print,
) -> dict[str, Any]:
    """One chaos run on fresh shards; returns the checks and figures (see the module doc)."""
    root = Path(tempfile.mkdtemp(prefix="krablet-chaos-", dir="/tmp"))
    root.chmod(0o755)
    (root / "logs").mkdir()
    pgdata = [root / f"shard-{i:03d}" for i in range(2)]
    try:
        dsns = [start_shard(p) for p in pgdata]
        wh = Warehouse.open(dsns, tables=[TABLE])
        for i in range(2):
            with wh.cluster.connect(i) as conn:
                conn.execute(AUDIT)
        with wh.funnel() as f:
            f.upsert("chaos", [{"n": n} for n in range(rows)])
        wh.close()
        path = wh.cluster.save(root / "cluster.json")
        per_shard = [sum(1 for n in range(rows) if wh.cluster.shard_of(n) == i) for i in range(2)]
        say(f"chaos: {rows} rows ({per_shard[0]} + {per_shard[1]}), {workers} workers")

        args = ["--batch-size", str(batch_size), "--lease-s", str(lease_s), "--give-up-s", "120"]
        pool = Workers(workers, path, root / "logs", args, {"CHAOS_DELAY": str(delay_s)})
        marks: dict[str, float] = {}

        def outage() -> None:
            marks["left"] = _query(dsns[0], "SELECT count(*) FROM _kq_chaos_square")[0][0]
            marks["stop_begin"] = time.time()
            stop_shard(pgdata[1], mode="fast")
            marks["down"] = time.time()
            time.sleep(max(0.0, outage_s - (marks["down"] - marks["stop_begin"])))
            marks["start_begin"] = time.time()
            start_shard(pgdata[1])
            marks["up"] = time.time()

        t0 = time.time()
        kills: list[tuple[float, int, list[int]]] = []  # (time, pid, keys it held)
        outage_thread = threading.Thread(target=outage, daemon=True)
        k = 0
        while time.time() - t0 < chaos_s or "stop_begin" not in marks:
            time.sleep(kill_every_s)
            if "progress" not in marks and _query(dsns[0], "SELECT 1 FROM chaos_writes LIMIT 1"):
                marks["progress"] = time.time()  # the outage clock starts at the first result
            due = time.time() - marks.get("progress", float("inf")) >= outage_at_s
            if due and not outage_thread.is_alive() and "stop_begin" not in marks:
                outage_thread.start()
            at = time.time()
            pid = pool.kill(k % workers)
            held = [
                r[0]
                for dsn in dsns
                for r in _query(
                    dsn,
                    "SELECT key FROM _kq_chaos_square WHERE owner LIKE %s AND token IS NOT NULL",
                    (f"%:{pid}:%",),
                )
            ]
            kills.append((at, pid, held))
            k += 1
        outage_thread.join()
        say(f"chaos: {len(kills)} kills in {time.time() - t0:.0f}s; waiting for the workers")
        codes = pool.wait(finish_timeout_s)
        finished = time.time()

        writes = [(n, at.timestamp()) for dsn in dsns for n, at in _query(
            dsn, "SELECT n, at FROM chaos_writes")]  # fmt: skip
        done = {n: v for dsn in dsns for n, v in _query(dsn, "SELECT n, result FROM chaos")}
        left = sum(_query(dsn, "SELECT count(*) FROM _kq_chaos_square")[0][0] for dsn in dsns)
    finally:
        for p in pgdata:
            stop_shard(p, mode="immediate")
        shutil.rmtree(root, ignore_errors=True)

    per_key: dict[int, int] = {}
    first_write: dict[int, float] = {}
    for n, at in writes:
        per_key[n] = per_key.get(n, 0) + 1
        first_write[n] = min(first_write.get(n, at), at)
    lost = sum(1 for n in range(rows) if done.get(n) != n * n)
    double = sum(1 for c in per_key.values() if c > 1)
    healthy = [at for n, at in writes if wh.cluster.shard_of(n) == 0]
    window = marks["start_begin"] - marks["down"]
    before = _rate(healthy, marks["stop_begin"] - window, marks["stop_begin"])
    during = _rate(healthy, marks["down"], marks["start_begin"])
    waits = [first_write[n] - at for at, _, held in kills for n in held if n in first_write]
    result = {
        "rows": rows,
        "workers": workers,
        "kills": len(kills),
        "kill_every_s": kill_every_s,
        "chaos_s": chaos_s,
        "outage_s": round(window, 2),
        "lease_s": lease_s,
        "batch_size": batch_size,
        "handler_delay_s": delay_s,
        "seconds": round(finished - t0, 1),
        "lost": lost,
        "double_writes": double,
        "queue_left": left,
        "queue_left_at_outage": marks["left"],  # on the healthy shard
        "worker_exit_codes": codes,
        "healthy_rate_before": round(before, 1),
        "healthy_rate_during": round(during, 1),
        "healthy_ratio": round(during / before, 3) if before else None,
        "healthy_writes_during_outage": sum(
            marks["down"] <= t < marks["start_begin"] for t in healthy
        ),
        "killed_rows": len(waits),
        "killed_rows_wait_median_s": round(statistics.median(waits), 2) if waits else None,
        "killed_rows_wait_max_s": round(max(waits), 2) if waits else None,
    }
    say("chaos: " + json.dumps(result))
    return result


def markdown(r: dict[str, Any]) -> str:
    from benchmarks.report import table

    return "\n".join(
        [
            "## Chaos: killed workers and a shard outage (krablet)",
            "",
            f"`benchmarks/chaos.py`: {r['rows']:,} rows on 2 embedded shards, {r['workers']} CLI "
            f"workers (`--until-empty`, batch {r['batch_size']}, handler {r['handler_delay_s']} s "
            f"per batch, lease {r['lease_s']} s); one worker SIGKILLed and replaced every "
            f"{r['kill_every_s']} s for {r['chaos_s']:.0f} s ({r['kills']} kills); shard 1 "
            f"stopped for {r['outage_s']} s and restarted. Completion times come from a row "
            "trigger on each shard. While shard 1 is down every worker claims from shard 0, so "
            "its rate may rise; a ratio below 1 would mean the dead shard slowed the live one. "
            "A killed worker's rows come back after the lease, behind the ready backlog "
            "(retry-at-end), hence their wait.",
            "",
            table(
                ["check", "value"],
                [
                    ["rows lost (not done, or wrong value)", r["lost"]],
                    ["rows with more than one result write", r["double_writes"]],
                    ["queue rows left", r["queue_left"]],
                    ["healthy shard, rows/s just before the outage", r["healthy_rate_before"]],
                    ["healthy shard, rows/s during the outage", r["healthy_rate_during"]],
                    ["ratio (must be ≥ 0.7)", r["healthy_ratio"]],
                    [
                        "a killed worker's leased rows: wait until done, median / max (s)",
                        f"{r['killed_rows_wait_median_s']} / {r['killed_rows_wait_max_s']} "
                        f"({r['killed_rows']} rows)",
                    ],
                    ["whole run (s)", r["seconds"]],
                ],
            ),
        ]
    )  # fmt: skip


def rewrite_section() -> None:
    """Rewrite the docs section from benchmarks/results/chaos.json (no new run)."""
    from benchmarks.report import ROOT, write_results

    saved = json.loads((ROOT / "benchmarks" / "results" / "chaos.json").read_text())
    r = {k: v for k, v in saved.items() if k not in ("area", "when", "machine")}
    write_results("chaos", r, markdown(r))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--kill-every-s", type=float, default=2.0)
    ap.add_argument("--chaos-s", type=float, default=60.0)
    ap.add_argument("--outage-at-s", type=float, default=20.0)
    ap.add_argument("--outage-s", type=float, default=10.0)
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--delay-s", type=float, default=0.4)
    ap.add_argument("--lease-s", type=float, default=3.0)
    ap.add_argument("--no-write", action="store_true", help="Do not write results or docs.")
    ap.add_argument(
        "--rewrite-docs", action="store_true", help="Only rewrite the docs section from the JSON."
    )
    a = ap.parse_args()
    if a.rewrite_docs:
        rewrite_section()
        return
    r = run(
        rows=a.rows,
        workers=a.workers,
        kill_every_s=a.kill_every_s,
        chaos_s=a.chaos_s,
        outage_at_s=a.outage_at_s,
        outage_s=a.outage_s,
        batch_size=a.batch_size,
        delay_s=a.delay_s,
        lease_s=a.lease_s,
    )
    if not a.no_write:
        from benchmarks.report import write_results

        write_results("chaos", r, markdown(r))
    ok = r["lost"] == 0 and r["double_writes"] == 0 and (r["healthy_ratio"] or 0) >= 0.7
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
