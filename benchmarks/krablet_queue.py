"""krablet queue and funnel benchmarks, side by side with PgQueuer, procrastinate and pgbench.

Everything runs against one fresh embedded Postgres (pgserver, stock durable settings) in one
run, sequentially. Peers are installed in a throwaway virtual environment, never in the lock:

    uv venv /tmp/peerbench -p 3.11
    VIRTUAL_ENV=/tmp/peerbench uv pip install pgqueuer==1.6.0 procrastinate==3.10.0 asyncpg \\
        typer uvloop tqdm tabulate "psycopg[binary]"
    # PgQueuer's own driver, unchanged, from its repository (tools/benchmark.py):
    curl -L -o /tmp/pgq_benchmark.py \\
        https://raw.githubusercontent.com/janbjorge/pgqueuer/main/tools/benchmark.py
    uv run --no-sync python benchmarks/krablet_queue.py --peer-python /tmp/peerbench/bin/python \\
        --pgqueuer-driver /tmp/pgq_benchmark.py

Sections (each prints one line per measurement; all numbers land in --out as JSON):
  drain     50,000 no-op jobs, 5 dequeuers, batch 100: krablet Worker vs PgQueuer's driver
            (``-s drain``) vs procrastinate (concurrency 5; it claims one job per call).
  leased    krablet claim+complete throughput (4 processes, batch 50) on an empty-headed queue,
            then with 50,000 leased-but-unfinished rows at the head; and, for contrast, the
            lock-held design (reference claim.sql via pgbench) with 0 and 50,000 locked rows.
  funnel    contended upserts on 10,000 keys: single-row psycopg upserts (8 threads), the funnel
            at batch 100, and the pgbench ceiling (100 sorted keys per INSERT … ON CONFLICT,
            8 clients).
Without --peer-python the peer rows are skipped (and say so).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from krea2.krablet import Job, Table, Warehouse, start_shard, stop_shard

PGBIN = None  # set in main: pgserver's bin directory (pgbench, psql)


def log(msg: str) -> None:
    print(msg, flush=True)


def new_db(base_dsn: str) -> tuple[str, str]:
    name = f"b_{secrets.token_hex(4)}"
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = base_dsn.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}?{query}", name


def socket_dir(dsn: str) -> str:
    return re.search(r"host=([^&]+)", dsn).group(1)


def pgbench(dsn: str, db: str, script: str, seconds: int, clients: int = 8, **defs) -> dict:
    path = Path(tempfile.mkstemp(suffix=".sql")[1])
    path.write_text(script)
    cmd = [
        str(PGBIN / "pgbench"),
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
        "2",
        "-f",
        str(path),
    ]
    for k, v in defs.items():
        cmd += ["-D", f"{k}={v}"]
    out = subprocess.run([*cmd, db], capture_output=True, text=True, check=True).stdout
    path.unlink()
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
    failed = re.search(r"number of failed transactions: (\d+)", out)
    return {"tps": tps, "failed": int(failed.group(1)) if failed else 0}


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


def kv_db(base: str, keys: int) -> tuple[str, str]:
    dsn, db = new_db(base)
    Warehouse.open([dsn], tables=[KV]).close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO kv SELECT g, 0, now() FROM generate_series(1, %s) g", (keys,))
        conn.execute("VACUUM ANALYZE kv")
    return dsn, db


def single_row_upserts(base: str, keys: int, threads: int, seconds: float) -> dict:
    dsn, _ = kv_db(base, keys)
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
    return {"rows_per_s": sum(counts) / (time.perf_counter() - t0), "threads": threads}


def funnel_upserts(base: str, keys: int, batch: int, seconds: float) -> dict:
    dsn, _ = kv_db(base, keys)
    wh = Warehouse.open([dsn], tables=[KV], migrate=False)
    before = table_writes(dsn, "kv")
    f = wh.funnel(max_batch=batch, writers_per_shard=8)  # as `krea2 krablet funnel` runs it
    rng = random.Random(1)
    accepted = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ks = sorted({rng.randrange(1, keys + 1) for _ in range(batch)})
        f.upsert("kv", [{"id": k, "v": accepted + j} for j, k in enumerate(ks)])
        accepted += len(ks)
    f.flush()  # durable: every accepted row is committed before the clock stops
    dt = time.perf_counter() - t0
    written = f.rows_written
    f.close()
    wh.close()
    time.sleep(1.0)  # closed backends report their counters asynchronously
    db_rows = table_writes(dsn, "kv") - before
    return {
        "accepted_rows_per_s": accepted / dt,
        "written_rows_per_s": written / dt,
        "db_rows_per_s": db_rows / dt,
        "statements": f.batches_written,
    }


def pgbench_ceiling(base: str, keys: int, seconds: int) -> dict:
    dsn, db = kv_db(base, keys)
    before = table_writes(dsn, "kv")
    t0 = time.perf_counter()
    res = pgbench(dsn, db, UPSERT100, seconds, K=keys)
    dt = time.perf_counter() - t0
    rows = table_writes(dsn, "kv") - before
    return {
        "statements_per_s": res["tps"],
        "rows_per_s": rows / dt,
        "failed": res["failed"],
        "rows_per_s_from_tps": res["tps"] * 99.5,
    }


# ---------------------------------------------------------------------------------------------
# docs/benchmarks.md section
# ---------------------------------------------------------------------------------------------

BEGIN, END = "<!-- queue:begin -->", "<!-- queue:end -->"


def render(res: dict) -> str:
    st = res["settings"]
    lines = [
        BEGIN,
        "## Queue and funnel (`benchmarks/krablet_queue.py`)",
        "",
        f"One embedded PostgreSQL {st.get('server_version')} (pgserver), stock durable settings "
        f"(fsync {st.get('fsync')}, synchronous_commit {st.get('synchronous_commit')}, "
        f"shared_buffers {int(st.get('shared_buffers', 0)) * 8 // 1024} MB), {res['cpus']} CPUs "
        "shared by Postgres and the clients, everything run sequentially in one run. "
        "Peers come from a throwaway venv; PgQueuer's own `tools/benchmark.py` ran unchanged.",
        "",
    ]
    if "drain" in res:
        d = res["drain"]
        k = d["knobs"]
        lines += [
            f"**Drain** {k['jobs']:,} no-op jobs, {k['dequeuers']} dequeuers, batch {k['batch']}:",
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
            f"{k['seconds']} s each):",
            "",
            "| design | empty head jobs/s | held head jobs/s | ratio |",
            "| --- | --- | --- | --- |",
            f"| krablet lease (narrow queue table) | {kr['empty_head']:,.0f} | "
            f"{kr['leased_head']:,.0f} | "
            f"**{kr['ratio']:.2f}** (target ≥ 0.75) |",
            f"| lock held for the job (reference claim.sql, pgbench x8) | {lh['no_locks']:,.0f} | "
            f"{lh['locked_head']:,.0f} | {lh['ratio']:.2f} |",
            "",
        ]
    for label in ("contended", "uncontended"):
        r = res.get(f"funnel_{label}")
        if not r:
            continue
        k = r["knobs"]
        f = r["funnel"]
        lines += [
            f"**Upserts, {label}** ({k['keys']:,} keys, {k['seconds']} s, durable commits):",
            "",
            "| writer | rows/s | ratio |",
            "| --- | --- | --- |",
            f"| single-row `INSERT … ON CONFLICT` through psycopg, 8 threads | "
            f"{r['single_row']['rows_per_s']:,.0f} | 1 |",
            "| funnel, batch 100, 8 writers (rows accepted and flushed durable) | "
            f"{f['accepted_rows_per_s']:,.0f} | "
            f"**{r['funnel_over_single_row']:.1f}x** single-row (target ≥ 10), "
            f"**{r['funnel_over_pgbench']:.2f}** of pgbench (target ≥ 0.8) |",
            "| … rows written after coalescing repeated keys | "
            f"{f['written_rows_per_s']:,.0f} | "
            f"{r['funnel_written_over_pgbench']:.2f} of pgbench |",
            f"| pgbench, 100 sorted keys per `INSERT … ON CONFLICT`, 8 clients | "
            f"{r['pgbench']['rows_per_s']:,.0f} | ceiling |",
            "",
        ]
    lines += [
        "Reproduce: see the docstring of `benchmarks/krablet_queue.py` (peer venv, then "
        "`uv run --no-sync python benchmarks/krablet_queue.py "
        "--peer-python /tmp/peerbench/bin/python "
        "--pgqueuer-driver /tmp/pgq_benchmark.py --write-docs docs/benchmarks.md`). "
        "Raw numbers: `benchmarks/results/queue.json`.",
        "",
        f"_{res['started']} – {res.get('finished', '')} UTC, {res['cpus']} CPUs; other work was "
        "running on the machine, so treat ±25% as noise._",
        END,
    ]
    return "\n".join(lines)


def write_docs(path: str, res: dict) -> None:
    p = Path(path)
    text = p.read_text() if p.exists() else "# Benchmarks\n"
    block = render(res)
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    p.write_text(text)


# ---------------------------------------------------------------------------------------------


def main() -> None:
    global PGBIN
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--peer-python", help="python of the throwaway venv with pgqueuer/procrastinate"
    )
    ap.add_argument("--pgqueuer-driver", help="PgQueuer's tools/benchmark.py (run unchanged)")
    ap.add_argument("--sections", default="drain,leased,funnel")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--out", default="benchmarks/results/queue.json")
    ap.add_argument("--write-docs", help="update this file's queue section (docs/benchmarks.md)")
    ap.add_argument(
        "--render-only", action="store_true", help="only re-render --out into --write-docs"
    )
    args = ap.parse_args()
    if args.render_only:
        write_docs(args.write_docs or "docs/benchmarks.md", json.loads(Path(args.out).read_text()))
        return
    import pgserver

    PGBIN = Path(pgserver.__file__).parent / "pginstall" / "bin"
    q = args.quick
    root = Path(tempfile.mkdtemp(prefix="krablet-bench-", dir="/tmp"))
    root.chmod(0o755)
    base = start_shard(root / "pg")
    with psycopg.connect(base) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'shared_buffers', 'server_version', "
                "'full_page_writes')"
            ).fetchall()
        )
    results: dict = {
        "settings": settings,
        "cpus": os.cpu_count(),
        "started": time.strftime("%F %T"),
    }
    log(f"postgres {settings}")
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
            r["lock_held"] = lock_held_contrast(base, rows, held, secs, 50)
            log(
                f"claims lock-held  no locks {r['lock_held']['no_locks']:8.0f} jobs/s, "
                f"{held} locked at head {r['lock_held']['locked_head']:8.0f} jobs/s "
                f"(ratio {r['lock_held']['ratio']:.2f})"
            )
        if "funnel" in sections:
            secs = 4 if q else 8
            for label, keys in (
                ("contended", 10_000),
                ("uncontended", 200_000 if q else 1_000_000),
            ):
                r = results[f"funnel_{label}"] = {
                    "knobs": {"keys": keys, "batch": 100, "seconds": secs}
                }
                r["single_row"] = single_row_upserts(base, keys, 8, secs)
                r["funnel"] = funnel_upserts(base, keys, 100, secs)
                r["pgbench"] = pgbench_ceiling(base, keys, secs)
                f, one, ceil = (
                    r["funnel"],
                    r["single_row"]["rows_per_s"],
                    r["pgbench"]["rows_per_s"],
                )
                r["funnel_over_single_row"] = f["accepted_rows_per_s"] / one
                r["funnel_over_pgbench"] = f["accepted_rows_per_s"] / ceil
                r["funnel_written_over_pgbench"] = f["written_rows_per_s"] / ceil
                log(
                    f"upsert {label} ({keys} keys): single-row psycopg x8 {one:8.0f} rows/s"
                    f" | funnel {f['accepted_rows_per_s']:8.0f} rows/s durable"
                    f" ({f['written_rows_per_s']:.0f} written "
                    f"after coalescing) | pgbench 100 sorted keys x8 {ceil:8.0f} rows/s"
                )
                log(
                    f"  funnel/single-row {r['funnel_over_single_row']:.1f}x (target >= 10), "
                    f"funnel/pgbench {r['funnel_over_pgbench']:.2f} (target >= 0.8; "
                    f"written rows only: {r['funnel_written_over_pgbench']:.2f})"
                )
    finally:
        stop_shard(root / "pg", mode="immediate")
        shutil.rmtree(root, ignore_errors=True)
        results["finished"] = time.strftime("%F %T")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        log(f"results written to {args.out}")
        if args.write_docs:
            write_docs(args.write_docs, results)
            log(f"section written to {args.write_docs}")


if __name__ == "__main__":
    sys.exit(main())
