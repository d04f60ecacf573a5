"""krablet queue and funnel benchmarks, side by side with PgQueuer, procrastinate and pgbench.

Everything runs against one fresh embedded Postgres (pgserver, stock durable settings) in one
run, sequentially. Peers are installed in a throwaway virtual environment, never in the lock:

    uv venv /tmp/peerbench -p 3.11
    VIRTUAL_ENV=/tmp/peerbench uv pip install pgqueuer==1.6.0 procrastinate==3.10.0 asyncpg \\
        typer uvloop tqdm tabulate "psycopg[binary]"
    # PgQueuer's own driver, unchanged, from its repository (tools/benchmark.py):
    curl -L -o /tmp/pgq_benchmark.py \\
        https://raw.githubusercontent.com/janbjorge/pgqueuer/main/tools/benchmark.py
    uv run --no-sync python -m benchmarks.krablet_queue --peer-python /tmp/peerbench/bin/python \\
        --pgqueuer-driver /tmp/pgq_benchmark.py --write-docs

Sections (each prints one line per measurement; the numbers land in --out as JSON, or with
--write-docs in benchmarks/results/queue.json and the queue section of docs/benchmarks.md):
  drain     50,000 no-op jobs, 5 dequeuers, batch 100: krablet Worker vs PgQueuer's driver
            (``-s drain``) vs procrastinate (concurrency 5; it claims one job per call).
  leased    krablet claim+complete throughput (4 processes, batch 50) on an empty-headed queue,
            then with 50,000 leased-but-unfinished rows at the head; and, for contrast, the
            lock-held design (reference claim.sql via pgbench) with 0 and 50,000 locked rows.
  funnel    upserts, uncontended (1,000,000 keys) then contended (10,000 keys): single-row
            psycopg upserts (8 threads), then 3 rounds of the funnel (8 writers, one producer
            thread calling upsert with 100 random keys) and the pgbench ceiling (100 sorted keys
            per INSERT … ON CONFLICT, 8 clients) back to back. Both commit durably
            (synchronous_commit on); compared on rows *written* (the server's n_tup_ins +
            n_tup_upd, so rows coalesced in the funnel's buffer do not count), with CPU seconds
            per 1,000 rows written for the client process and for the server (the postmaster and
            its children, from /proc), and the commit latency of a one-row durable UPDATE
            measured by pgbench at the start of each round. pgbench is pgserver's own, else the
            system's; without one the pgbench rows say it is unavailable.
            Then, in the same run, both lines again **under load**: ``--load-procs`` processes
            (default: one per CPU) spinning on the CPU at normal priority for the whole
            line, as other jobs on a shared machine do; funnel and pgbench face the same load.
Without --peer-python the peer rows are skipped (and say so).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from krea2.krablet import Job, Table, Warehouse, start_shard, stop_shard

PGBENCH: str | None = None  # set in main: pgserver's pgbench, else the system's, else None
FUNNEL_WRITERS = 8  # writers per shard, as `krea2 krablet funnel` runs the funnel


def log(msg: str) -> None:
    print(msg, flush=True)


def new_db(base_dsn: str) -> tuple[str, str]:
    name = f"b_{secrets.token_hex(4)}"
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = base_dsn.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}?{query}", name


def drop_db(base_dsn: str, name: str) -> None:
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def socket_dir(dsn: str) -> str:
    return re.search(r"host=([^&]+)", dsn).group(1)


def pgbench(dsn: str, db: str, script: str, seconds: int, clients: int = 8, **defs) -> dict:
    path = Path(tempfile.mkstemp(suffix=".sql")[1])
    path.write_text(script)
    cmd = [
        PGBENCH,
        "-h",
        socket_dir(dsn),
        "-U",
        "postgres",
        "-n",
        "-T",
        str(seconds),
        "-c",
        str(clients),
        "-j",
        str(min(2, clients)),
        "-f",
        str(path),
    ]
    for k, v in defs.items():
        cmd += ["-D", f"{k}={v}"]
    out = subprocess.run([*cmd, db], capture_output=True, text=True, check=True).stdout
    path.unlink()
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
    failed = re.search(r"number of failed transactions: (\d+)", out)
    latency = re.search(r"latency average = ([\d.]+) ms", out)
    return {
        "tps": tps,
        "failed": int(failed.group(1)) if failed else 0,
        "latency_ms": float(latency.group(1)) if latency else None,
    }


def table_writes(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relname = %s", (table,)
        ).fetchone()
    return int(row[0]) if row else 0


# ---------------------------------------------------------------------------------------------
# drain
# ---------------------------------------------------------------------------------------------

JOBS = Table(
    "jobs",
    key="id",
    key_type="bigint",
    columns={"payload": "text", "done": "boolean"},
    jobs=[Job("run", result="done", inputs=["payload"])],
)


def krablet_drain(base: str, n: int, dequeuers: int, batch: int) -> dict:
    from krea2.krablet import Worker

    dsn, _ = new_db(base)
    wh = Warehouse.open([dsn], tables=[JOBS])
    with wh.cluster.connect(0) as conn:
        conn.execute(
            "INSERT INTO jobs (id, payload) SELECT g, '' FROM generate_series(1, %s) g", (n,)
        )
        conn.execute("VACUUM ANALYZE jobs, _kq_jobs_run")
    w = Worker(
        wh,
        "jobs",
        "run",
        lambda rows: [{"done": True}] * len(rows),
        batch_size=batch,
        concurrency=dequeuers,
        poll_s=0.05,
    )
    t0 = time.perf_counter()
    stats = w.run(until_empty=True)
    dt = time.perf_counter() - t0
    wh.close()
    assert stats.completed == n, stats
    return {"jobs": n, "seconds": dt, "rate": n / dt}


def pgqueuer_drain(base: str, peer: str, driver: str, n: int, dequeuers: int, batch: int) -> dict:
    dsn, db = new_db(base)
    env = {**os.environ, "PGHOST": socket_dir(dsn), "PGUSER": "postgres", "PGDATABASE": db}
    pgq = str(Path(peer).with_name("pgq"))
    subprocess.run([pgq, "install"], env=env, check=True, capture_output=True)
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    subprocess.run(
        [
            peer,
            driver,
            "-d",
            "apg",
            "-s",
            "drain",
            "--jobs",
            str(n),
            "--dequeue",
            str(dequeuers),
            "--dequeue-batch-size",
            str(batch),
            "--output-json",
            str(out),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    res = json.loads(out.read_text())
    out.unlink()
    return {"jobs": n, "rate": float(res["rate"]), "driver": "apg"}


PROCRASTINATE = r"""
import asyncio, json, sys, time
from procrastinate import App, PsycopgConnector
n, conc, conninfo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
app = App(connector=PsycopgConnector(conninfo=conninfo))

@app.task(name="noop")
async def noop():
    return None

async def main():
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        t0 = time.perf_counter()
        for i in range(0, n, 1000):
            await noop.batch_defer_async(*([{}] * min(1000, n - i)))
        defer = time.perf_counter() - t0
        t0 = time.perf_counter()
        await app.run_worker_async(concurrency=conc, wait=False, install_signal_handlers=False)
        drain = time.perf_counter() - t0
    print(json.dumps({"defer_rate": n / defer, "rate": n / drain}))

asyncio.run(main())
"""


def procrastinate_drain(base: str, peer: str, n: int, concurrency: int) -> dict:
    dsn, _ = new_db(base)
    out = subprocess.run(
        [peer, "-c", PROCRASTINATE, str(n), str(concurrency), dsn],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {"jobs": n, **res}


# ---------------------------------------------------------------------------------------------
# claims with leased rows at the head
# ---------------------------------------------------------------------------------------------

ITEMS = Table(
    "items",
    key="id",
    key_type="bigint",
    columns={
        "url": "text",
        "sha1": "text",
        "width": "integer",
        "height": "integer",
        "contains_text": "boolean",
        "pad": "text",
    },
    jobs=[Job("ocr", result="contains_text", inputs=["url"], lease_s=3600)],
    indexes=["url", "sha1"],
)


def _claimer(dsn: str, batch: int, seconds: float, out: mp.Queue) -> None:
    wh = Warehouse.open([dsn], tables=[ITEMS], migrate=False)
    q = wh.queue("items", "ocr")
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        c = q.claim(0, batch)
        if not c.rows:
            break
        done += len(q.complete(c, [{"contains_text": r["id"] % 7 != 0} for r in c.rows]))
    wh.close()
    out.put(done)


def claim_rate(dsn: str, procs: int, batch: int, seconds: float) -> float:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    ps = [ctx.Process(target=_claimer, args=(dsn, batch, seconds, out)) for _ in range(procs)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    total = sum(out.get(timeout=seconds + 60) for _ in ps)
    for p in ps:
        p.join()
    return total / (time.perf_counter() - t0)


def seed_items(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO items (id, url, sha1, width, height, pad) SELECT g, "
            "'https://x/' || g, md5(g::text), 512, 512, repeat('x', 200) "
            "FROM generate_series(1, %s) g",
            (n,),
        )
        conn.execute("VACUUM ANALYZE items, _kq_items_ocr")


def leased_head(base: str, rows: int, leased: int, procs: int, batch: int, seconds: float) -> dict:
    out = {}
    for label, hold in (("empty_head", 0), ("leased_head", leased)):
        dsn, _ = new_db(base)
        Warehouse.open([dsn], tables=[ITEMS]).close()
        seed_items(dsn, rows)
        if hold:
            wh = Warehouse.open([dsn], tables=[ITEMS], migrate=False)
            q = wh.queue("items", "ocr", owner="holder")
            got = 0
            while got < hold:
                got += len(q.claim(0, min(5000, hold - got), lease_s=3600))
            wh.close()
        out[label] = claim_rate(dsn, procs, batch, seconds)
    out["ratio"] = out["leased_head"] / out["empty_head"]
    return out


LOCKED_CLAIM = """
WITH c AS (SELECT id FROM items WHERE contains_text IS NULL ORDER BY id LIMIT :B
            FOR UPDATE SKIP LOCKED),
     u AS (UPDATE items i SET last_tried_at = now() FROM c WHERE i.id = c.id RETURNING i.id)
SELECT coalesce(string_agg(id::text, ','), '0') AS ids FROM u \\gset
UPDATE items SET contains_text = (id % 7 <> 0) WHERE id IN (:ids);
"""


def lock_held_contrast(base: str, rows: int, locked: int, seconds: int, batch: int) -> dict:
    """The reference's lock-held shape: claims skip rows another transaction keeps locked."""
    out = {}
    for label, hold in (("no_locks", 0), ("locked_head", locked)):
        dsn, db = new_db(base)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE items (id bigint PRIMARY KEY, url text, contains_text boolean, "
                "last_tried_at timestamptz, pad text) WITH (fillfactor = 70)"
            )
            conn.execute(
                "INSERT INTO items SELECT g, 'https://x/' || g, NULL, NULL, repeat('x', 200) "
                "FROM generate_series(1, %s) g",
                (rows,),
            )
            conn.execute("CREATE INDEX items_todo ON items (id) WHERE contains_text IS NULL")
            conn.execute("VACUUM ANALYZE items")
        holder = None
        if hold:
            holder = psycopg.connect(dsn)
            holder.execute("SELECT id FROM items ORDER BY id LIMIT %s FOR UPDATE", (hold,))
        out[label] = pgbench(dsn, db, LOCKED_CLAIM, seconds, B=batch)["tps"] * batch
        if holder is not None:
            holder.rollback()
            holder.close()
    out["ratio"] = out["locked_head"] / out["no_locks"]
    return out


# ---------------------------------------------------------------------------------------------
# funnel
# ---------------------------------------------------------------------------------------------

KV = Table("kv", key="id", key_type="bigint", columns={"v": "bigint", "updated_at": "timestamptz"})

UPSERT100 = """
\\set s random(1, :K)
INSERT INTO kv (id, v, updated_at)
SELECT k, 1, now() FROM (SELECT DISTINCT (1 + ((:s + (random()*:K)::bigint) % :K)) AS k
                         FROM generate_series(1,100)) x
ORDER BY k
ON CONFLICT (id) DO UPDATE SET v = kv.v + 1, updated_at = now();
"""


def server_cpu(pgdata: Path) -> float | None:
    """CPU seconds the server has used so far: the postmaster, its live children, and (through
    the postmaster's cutime/cstime) every backend that has exited. None where /proc is absent."""

    def fields(pid: str) -> list[str]:  # /proc/PID/stat after the command name: state is [0]
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    try:
        pid = (pgdata / "postmaster.pid").read_text().split()[0]
        ticks = sum(int(x) for x in fields(pid)[11:15])  # utime, stime, cutime, cstime
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    f = fields(d.name)
                except OSError:
                    continue  # exited meanwhile: now in the postmaster's cutime
                if f[1] == pid:
                    ticks += int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def commit_latency_ms(base: str, seconds: int) -> float:
    """Mean latency of a one-row durable UPDATE from one pgbench client: one WAL flush each."""
    dsn, db = new_db(base)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE one (id int PRIMARY KEY, v bigint)")
        conn.execute("INSERT INTO one VALUES (1, 0)")
    ms = pgbench(dsn, db, "UPDATE one SET v = v + 1 WHERE id = 1;\n", seconds, 1)["latency_ms"]
    drop_db(base, db)
    return ms


def kv_db(base: str, keys: int) -> tuple[str, str]:
    dsn, db = new_db(base)
    Warehouse.open([dsn], tables=[KV]).close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO kv SELECT g, 0, now() FROM generate_series(1, %s) g", (keys,))
        conn.execute("VACUUM ANALYZE kv")
        conn.execute("CHECKPOINT")  # every run starts without the seed's dirty pages
    return dsn, db


def single_row_upserts(base: str, keys: int, threads: int, seconds: float) -> dict:
    dsn, db = kv_db(base, keys)
    counts = [0] * threads

    def run(i: int) -> None:
        rng = random.Random(i)
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                conn.execute(
                    "INSERT INTO kv (id, v, updated_at) VALUES (%s, 1, now()) ON CONFLICT (id) "
                    "DO UPDATE SET v = kv.v + 1, updated_at = now()",
                    (rng.randrange(1, keys + 1),),
                )
                counts[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    drop_db(base, db)
    return {"rows_per_s": sum(counts) / dt, "threads": threads}


def funnel_upserts(base: str, pgdata: Path, keys: int, call_rows: int, seconds: float) -> dict:
    """One producer thread upserts ``call_rows`` random keys per call for ``seconds``, then
    flushes (durable: every accepted row is committed before the clock stops)."""
    dsn, db = kv_db(base, keys)
    wh = Warehouse.open([dsn], tables=[KV], migrate=False)
    before = table_writes(dsn, "kv")
    f = wh.funnel(writers_per_shard=FUNNEL_WRITERS)  # as `krea2 krablet funnel` runs it
    rng = random.Random(1)
    accepted = 0
    cpu0, producer0, server0 = own_cpu(), time.thread_time(), server_cpu(pgdata)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ks = sorted({rng.randrange(1, keys + 1) for _ in range(call_rows)})
        f.upsert("kv", [{"id": k, "v": accepted + j} for j, k in enumerate(ks)])
        accepted += len(ks)
    producer = time.thread_time() - producer0
    f.flush()
    dt = time.perf_counter() - t0
    cpu, server1 = own_cpu() - cpu0, server_cpu(pgdata)
    sent = f.rows_written
    f.close()
    wh.close()
    time.sleep(1.0)  # closed backends report their counters asynchronously
    written = table_writes(dsn, "kv") - before
    drop_db(base, db)
    return {
        "seconds": dt,
        "accepted_rows_per_s": accepted / dt,
        "sent_rows_per_s": sent / dt,
        "rows_per_s": written / dt,  # rows written, read back from the server's counters
        "statements": f.batches_written,
        "cpu_per_1k": 1000 * cpu / written,
        "producer_cpu_per_1k": 1000 * producer / written,
        "server_cpu_per_1k": None if server0 is None else 1000 * (server1 - server0) / written,
        "process_cores": cpu / dt,
    }


def pgbench_ceiling(base: str, pgdata: Path, keys: int, seconds: int) -> dict:
    dsn, db = kv_db(base, keys)
    before = table_writes(dsn, "kv")
    client0, server0 = children_cpu(), server_cpu(pgdata)
    t0 = time.perf_counter()
    res = pgbench(dsn, db, UPSERT100, seconds, K=keys)
    dt = time.perf_counter() - t0
    time.sleep(0.5)  # the postmaster reaps the exited backends (their CPU lands in cutime)
    client, server1 = children_cpu() - client0, server_cpu(pgdata)
    rows = table_writes(dsn, "kv") - before
    drop_db(base, db)
    return {
        "statements_per_s": res["tps"],
        "rows_per_s": rows / dt,
        "failed": res["failed"],
        "cpu_per_1k": 1000 * client / rows,
        "server_cpu_per_1k": None if server0 is None else 1000 * (server1 - server0) / rows,
    }


def medians(runs: list[dict]) -> dict:
    """Each numeric field's median over the runs."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if runs[0][k] is not None}


def funnel_line(base: str, pgdata: Path, keys: int, secs: int, rounds: int) -> dict:
    """Single-row upserts once, then ``rounds`` rounds of the funnel and pgbench back to back
    (alternating which goes first), each on a fresh table, with the commit latency measured at
    the start of every round. Ratios are per round (the two ran under the same conditions);
    the line reports their median."""
    r: dict = {"knobs": {"keys": keys, "call_rows": 100, "seconds": secs, "rounds": rounds}}
    r["single_row"] = single_row_upserts(base, keys, 8, secs)
    runs: dict[str, list] = {"funnel": [], "pgbench": [], "commit_latency_ms": []}
    for i in range(rounds):
        if PGBENCH is not None:
            runs["commit_latency_ms"].append(commit_latency_ms(base, 2))
        for who in ("funnel", "pgbench")[:: 1 if i % 2 == 0 else -1]:
            if who == "funnel":
                runs["funnel"].append(funnel_upserts(base, pgdata, keys, 100, secs))
            elif PGBENCH is not None:
                runs["pgbench"].append(pgbench_ceiling(base, pgdata, keys, secs))
    r["rounds"] = runs
    f, one = medians(runs["funnel"]), r["single_row"]["rows_per_s"]
    r["funnel"] = f
    r["funnel_over_single_row"] = f["rows_per_s"] / one
    msg = f"  funnel/single-row {r['funnel_over_single_row']:.1f}x (target >= 10)"
    if runs["pgbench"]:
        r["pgbench"] = medians(runs["pgbench"])
        pairs = zip(runs["funnel"], runs["pgbench"], strict=True)
        ratios = [a["rows_per_s"] / b["rows_per_s"] for a, b in pairs]
        r["ratios"] = ratios
        r["funnel_over_pgbench"] = statistics.median(ratios)
        r["commit_latency_ms"] = statistics.median(runs["commit_latency_ms"])
        msg += (
            f", funnel/pgbench {r['funnel_over_pgbench']:.2f} (target >= 0.8; rounds: "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + "; commit latency ms: "
            + ", ".join(f"{x:.2f}" for x in runs["commit_latency_ms"])
            + ")"
        )
    ceil = r["pgbench"]["rows_per_s"] if "pgbench" in r else float("nan")
    log(
        f"upsert {keys} keys, rows written/s (medians): single-row psycopg x8 {one:8.0f} | funnel "
        f"{f['rows_per_s']:8.0f} ({f['accepted_rows_per_s']:.0f} accepted) | pgbench {ceil:8.0f}"
    )
    log(msg)
    for who in ("funnel", "pgbench"):
        if who in r:
            c = r[who]
            server = c.get("server_cpu_per_1k")
            log(
                f"  {who} CPU-s per 1k rows written: client {c['cpu_per_1k']:.4f}, server "
                + ("unmeasured" if server is None else f"{server:.4f}")
            )
    return r


# ---------------------------------------------------------------------------------------------
# docs/benchmarks.md section (written by benchmarks.report, which checks the page first)
# ---------------------------------------------------------------------------------------------

SECTIONS = ("drain", "leased", "funnel_contended", "funnel_uncontended",
            "funnel_contended_loaded", "funnel_uncontended_loaded")  # fmt: skip


def _spin(stop) -> None:  # a CPU-bound process of the load: pure Python, no I/O
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x ^= i


class CpuLoad:
    """``procs`` processes spinning on the CPU while the block runs (other work on the
    machine); ``procs = 0`` is a quiet machine."""

    def __init__(self, procs: int) -> None:
        self.procs = procs
        self.stop = mp.Event()
        self.workers: list = []

    def __enter__(self) -> CpuLoad:
        for _ in range(self.procs):
            w = mp.Process(target=_spin, args=(self.stop,), daemon=True)
            w.start()
            self.workers.append(w)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(10)
            if w.is_alive():
                w.kill()


def _cpu(c: dict, key: str) -> str:
    return "unmeasured" if c.get(key) is None else f"{c[key]:.4f}"


def _cores(c: dict) -> str:
    """'client X + server Y cores' busy during a run: CPU per row times rows per second."""
    client = c["cpu_per_1k"] * c["rows_per_s"] / 1000
    server = c.get("server_cpu_per_1k")
    return f"{client:.2f} + " + (
        "?" if server is None else f"{server * c['rows_per_s'] / 1000:.2f}"
    )


def render_funnel(res: dict, label: str, r: dict) -> list[str]:
    k, f = r["knobs"], r["funnel"]
    st = res["settings"]
    lat = r.get("rounds", {}).get("commit_latency_ms")
    latency = ", ".join(f"{x:.2f}" for x in lat or [])
    lines = [
        f"**Upserts, {label}** ({k['keys']:,} keys; one producer thread calls `upsert` with "
        f"{k['call_rows']} random keys for {k['seconds']} s, then `flush()`; "
        f"rounds of funnel and pgbench back to back: {k['rounds']}, medians; every commit "
        f"durable on both sides: synchronous_commit {st.get('synchronous_commit')}, fsync "
        f"{st.get('fsync')}, wal_sync_method {st.get('wal_sync_method')}"
        + (f"; measured commit latency {latency} ms by round" if latency else "")
        + "). Rows written are the server's own count (`n_tup_ins + n_tup_upd`), so writes "
        "coalesced in the funnel's buffer do not count; CPU seconds per 1,000 rows written, the "
        "funnel's process including its producer:",
        "",
        "| writer | rows written/s | ratio | client CPU-s/1k | server CPU-s/1k |",
        "| --- | --- | --- | --- | --- |",
        f"| single-row `INSERT … ON CONFLICT` through psycopg, 8 threads | "
        f"{r['single_row']['rows_per_s']:,.0f} | 1 | | |",
    ]
    vs = f"**{r['funnel_over_single_row']:.1f}x** single-row (target ≥ 10)"
    if "pgbench" in r:
        rounds = ", ".join(f"{x:.2f}" for x in r["ratios"])
        vs += f", **{r['funnel_over_pgbench']:.2f}** of pgbench (target ≥ 0.8; rounds {rounds})"
    lines.append(
        f"| funnel, {FUNNEL_WRITERS} writers ({f['accepted_rows_per_s']:,.0f} rows/s accepted) | "
        f"{f['rows_per_s']:,.0f} | {vs} | {_cpu(f, 'cpu_per_1k')} "
        f"(producer {_cpu(f, 'producer_cpu_per_1k')}) | {_cpu(f, 'server_cpu_per_1k')} |"
    )
    if "pgbench" in r:
        p = r["pgbench"]
        lines.append(
            f"| pgbench, 100 sorted keys per `INSERT … ON CONFLICT`, 8 clients | "
            f"{p['rows_per_s']:,.0f} | 1 | {_cpu(p, 'cpu_per_1k')} | "
            f"{_cpu(p, 'server_cpu_per_1k')} |"
        )
    else:
        lines.append("| pgbench | unavailable | neither pgserver's bin nor PATH has it | | |")
    lines += ["", f"Cores busy (client + server): funnel {_cores(f)}"]
    if "pgbench" in r:
        lines[-1] += f", pgbench {_cores(r['pgbench'])}"
    lines[-1] += f" of {res['cpus']}."
    return [*lines, ""]


def render(res: dict) -> str:
    st = res["settings"]
    lines = [
        "## Queue and funnel (`benchmarks/krablet_queue.py`)",
        "",
        f"One embedded PostgreSQL {st.get('server_version')} (pgserver), stock durable settings "
        f"(fsync {st.get('fsync')}, synchronous_commit {st.get('synchronous_commit')}, "
        f"shared_buffers {int(st.get('shared_buffers', 0)) * 8 // 1024} MB), {res['cpus']} CPUs "
        "shared by Postgres and the clients, sections run one after another. "
        "Peers come from a throwaway venv; PgQueuer's own `tools/benchmark.py` ran unchanged.",
        "",
    ]
    if "drain" in res:
        d = res["drain"]
        k = d["knobs"]
        lines += [
            f"**Drain** {k['jobs']:,} no-op jobs, {k['dequeuers']} dequeuers, batch {k['batch']}"
            f"{_when(res, 'drain')}:",
            "",
            "| system | jobs/s | notes |",
            "| --- | --- | --- |",
            f"| krablet `Worker` (5 threads, claim+complete) | {d['krablet']['rate']:,.0f} | "
            "claims commit with synchronous_commit=off, completions durable |",
        ]
        if "pgqueuer" in d:
            lines.append(
                "| PgQueuer 1.6.0 (`benchmark.py -d apg -s drain`) | "
                f"{d['pgqueuer']['rate']:,.0f} | "
                f"krablet/PgQueuer = **{d['krablet_over_pgqueuer']:.2f}x** (target ≥ 2) |"
            )
        if "procrastinate" in d:
            p = d["procrastinate"]
            lines.append(
                f"| procrastinate 3.10.0 (concurrency 5, {p['jobs']:,} jobs) | {p['rate']:,.0f} | "
                f"claims one job per call (no batch knob); batch defer {p['defer_rate']:,.0f}/s |"
            )
        lines.append("")
    if "leased" in res:
        L = res["leased"]
        k = L["knobs"]
        kr, lh = L["krablet"], L["lock_held"]
        lines += [
            f"**Claims with {k['leased']:,} leased-but-unfinished rows at the head** "
            f"({k['rows']:,}-row wide table, {k['processes']} processes, batch {k['batch']}, "
            f"{k['seconds']} s each){_when(res, 'leased')}:",
            "",
            "| design | empty head jobs/s | held head jobs/s | ratio |",
            "| --- | --- | --- | --- |",
            f"| krablet lease (narrow queue table) | {kr['empty_head']:,.0f} | "
            f"{kr['leased_head']:,.0f} | "
            f"**{kr['ratio']:.2f}** (target ≥ 0.75) |",
        ]
        if lh:
            lines.append(
                f"| lock held for the job (reference claim.sql, pgbench x8) | "
                f"{lh['no_locks']:,.0f} | {lh['locked_head']:,.0f} | {lh['ratio']:.2f} |"
            )
        lines.append("")
    for label in ("uncontended", "contended"):
        if r := res.get(f"funnel_{label}"):
            lines += render_funnel(res, label, r)
    for label in ("uncontended", "contended"):
        if r := res.get(f"funnel_{label}_loaded"):
            load = f"{r['load_procs']} CPU-bound processes running beside them"
            lines += render_funnel(res, f"{label}, under load ({load})", r)
    if "funnel_uncontended" in res:
        lines += [FUNNEL_NOTE, ""]
    lines += [
        "Reproduce: see the docstring of `benchmarks/krablet_queue.py` (peer venv, then "
        "`uv run --no-sync python -m benchmarks.krablet_queue "
        "--peer-python /tmp/peerbench/bin/python "
        "--pgqueuer-driver /tmp/pgq_benchmark.py --write-docs`). "
        "Raw numbers: `benchmarks/results/queue.json`. Other work may have been running on the "
        "machine: treat ±25% as noise.",
    ]
    return "\n".join(lines)


FUNNEL_NOTE = "What bounds the funnel on this machine: see docs/krablet.md, *The funnel*."


def _when(res: dict, section: str) -> str:
    """' (measured DATE)' for a section carried over from an earlier run, else ''."""
    when = res.get("when_by_section", {}).get(section)
    return f" (measured {when} UTC)" if when and when != res["started"] else ""


def merged_with_previous(results: dict, previous: Path) -> dict:
    """This run's results, plus the sections it did not run from the last saved run (each
    keeping the date it was measured), so a partial run rewrites the whole docs section."""
    out = dict(results)
    whens = out.setdefault("when_by_section", {})
    for s in SECTIONS:
        if s in results:
            whens[s] = results["started"]
    if previous.exists():
        old = json.loads(previous.read_text())
        for s in SECTIONS:
            if s not in out and s in old:
                out[s] = old[s]
                whens[s] = old.get("when_by_section", {}).get(s, old.get("started"))
    return out


# ---------------------------------------------------------------------------------------------


def find_pgbench() -> str | None:
    """pgserver's pgbench (the server's own version), else one on PATH, else None."""
    import pgserver

    own = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench"
    return str(own) if own.exists() else shutil.which("pgbench")


def main() -> None:
    global PGBENCH
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--peer-python", help="python of the throwaway venv with pgqueuer/procrastinate"
    )
    ap.add_argument("--pgqueuer-driver", help="PgQueuer's tools/benchmark.py (run unchanged)")
    ap.add_argument("--sections", default="drain,leased,funnel")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument(
        "--load-procs",
        type=int,
        help="CPU-bound processes beside the funnel's loaded lines (default: one per CPU; "
        "0: skip the loaded lines)",
    )
    ap.add_argument("--out", default="benchmarks/results/queue.json", help="without --write-docs")
    ap.add_argument(
        "--write-docs",
        action="store_true",
        help="save benchmarks/results/queue.json and the queue section of docs/benchmarks.md "
        "(sections not run are carried over from the last saved run, with their dates)",
    )
    ap.add_argument(
        "--render-only", action="store_true", help="only re-render the saved results into docs"
    )
    args = ap.parse_args()
    if args.render_only or args.write_docs:
        from benchmarks.report import ROOT, write_results

        saved = ROOT / "benchmarks" / "results" / "queue.json"
    if args.render_only:
        res = json.loads(saved.read_text())
        write_results("queue", res, render(res))
        return
    PGBENCH = find_pgbench()
    q = args.quick
    root = Path(tempfile.mkdtemp(prefix="krablet-bench-", dir="/tmp"))
    root.chmod(0o755)
    base = start_shard(root / "pg")
    with psycopg.connect(base) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'shared_buffers', 'server_version', "
                "'full_page_writes', 'wal_sync_method', 'commit_delay')"
            ).fetchall()
        )
    results: dict = {
        "settings": settings,
        "cpus": os.cpu_count(),
        "started": time.strftime("%F %T", time.gmtime()),
        "pgbench": PGBENCH,
    }
    log(f"postgres {settings}")
    log(f"pgbench: {PGBENCH or 'unavailable (neither pgserver nor PATH has it): no pgbench rows'}")
    sections = set(args.sections.split(","))
    try:
        if "drain" in sections:
            n = 10_000 if q else 50_000
            r = results["drain"] = {"knobs": {"jobs": n, "dequeuers": 5, "batch": 100}}
            r["krablet"] = krablet_drain(base, n, 5, 100)
            log(f"drain krablet          {r['krablet']['rate']:9.0f} jobs/s")
            if args.peer_python and args.pgqueuer_driver:
                r["pgqueuer"] = pgqueuer_drain(
                    base, args.peer_python, args.pgqueuer_driver, n, 5, 100
                )
                log(f"drain pgqueuer 1.6.0   {r['pgqueuer']['rate']:9.0f} jobs/s")
                r["krablet_over_pgqueuer"] = r["krablet"]["rate"] / r["pgqueuer"]["rate"]
                log(f"  ratio krablet/pgqueuer {r['krablet_over_pgqueuer']:.2f} (target >= 2)")
            if args.peer_python:
                r["procrastinate"] = procrastinate_drain(
                    base, args.peer_python, 3_000 if q else 10_000, 5
                )
                log(
                    f"drain procrastinate    {r['procrastinate']['rate']:9.0f} jobs/s"
                    " (concurrency 5)"
                )
            else:
                log("drain peers skipped: pass --peer-python (and --pgqueuer-driver)")
        if "leased" in sections:
            rows, held, secs = (60_000, 20_000, 4) if q else (250_000, 50_000, 8)
            r = results["leased"] = {
                "knobs": {
                    "rows": rows,
                    "leased": held,
                    "processes": 4,
                    "batch": 50,
                    "seconds": secs,
                }
            }
            r["krablet"] = leased_head(base, rows, held, 4, 50, secs)
            log(
                f"claims krablet empty head {r['krablet']['empty_head']:8.0f} jobs/s, "
                f"{held} leased at head {r['krablet']['leased_head']:8.0f} jobs/s "
                f"(ratio {r['krablet']['ratio']:.2f}, target >= 0.75)"
            )
            r["lock_held"] = {}
            if PGBENCH is not None:
                r["lock_held"] = lock_held_contrast(base, rows, held, secs, 50)
                log(
                    f"claims lock-held  no locks {r['lock_held']['no_locks']:8.0f} jobs/s, "
                    f"{held} locked at head {r['lock_held']['locked_head']:8.0f} jobs/s "
                    f"(ratio {r['lock_held']['ratio']:.2f})"
                )
        if "funnel" in sections:
            secs, rounds = (4, 1) if q else (8, 3)
            lines = (("uncontended", 200_000 if q else 1_000_000), ("contended", 10_000))
            for label, keys in lines:
                results[f"funnel_{label}"] = funnel_line(base, root / "pg", keys, secs, rounds)
            load = (os.cpu_count() or 1) if args.load_procs is None else args.load_procs
            for label, keys in lines if load > 0 else ():
                log(f"under load: {load} CPU-bound processes")
                with CpuLoad(load):
                    r = funnel_line(base, root / "pg", keys, secs, rounds)
                results[f"funnel_{label}_loaded"] = {**r, "load_procs": load}
    finally:
        stop_shard(root / "pg", mode="immediate")
        shutil.rmtree(root, ignore_errors=True)
        results["finished"] = time.strftime("%F %T", time.gmtime())
        if args.write_docs:
            results = merged_with_previous(results, saved)
            write_results("queue", results, render(results))
            log(f"results written to {saved}; section 'queue' of docs/benchmarks.md rewritten")
        else:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2))
            log(f"results written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
