"""krablet's Prometheus metrics (through :mod:`krea2.infra.metrics`) and what feeds them.

Per job and shard: backlog (the autoscaling signal: ready rows counted through the queue's
index with a cap, never ``count(*)`` of a wide table), leased and backing-off rows, oldest-ready
age, claims, completions, failures and claim latency. Per shard: dead tuples, the HOT-update
ratio and the age of the oldest transaction (xmin horizon).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from krea2.infra import metrics as m
from krea2.krablet.sql import reads

if TYPE_CHECKING:
    from krea2.krablet.warehouse import Warehouse

PKG = "krablet"
JOB = ("table", "job", "shard")

claims = m.counter(PKG, "claimed_rows_total", "Rows leased by claims.", JOB)
completions = m.counter(PKG, "completed_rows_total", "Rows whose results were written.", JOB)
failures = m.counter(PKG, "failed_rows_total", "Rows whose attempt failed (they retry later).", JOB)
lost = m.counter(PKG, "lost_leases_total", "Rows whose lease was lost before completion.", JOB)
claim_latency = m.histogram(
    PKG,
    "claim_seconds",
    "Latency of one claim statement.",
    JOB,
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5),
)
backlog = m.gauge(PKG, "backlog_rows", "Ready rows per job and shard (capped count).", JOB, "max")
leased = m.gauge(PKG, "leased_rows", "Rows under a live lease.", JOB, "max")
backing_off = m.gauge(
    PKG, "backing_off_rows", "Failed rows waiting for their retry time.", JOB, "max"
)
oldest_ready = m.gauge(PKG, "oldest_ready_seconds", "Age of the oldest ready row.", JOB, "max")
dead_tuples = m.gauge(
    PKG, "dead_tuples", "Dead tuples per shard (all krablet tables).", ("shard",), "max"
)
hot_ratio = m.gauge(PKG, "hot_update_ratio", "HOT updates / updates per shard.", ("shard",), "max")
xmin_age = m.gauge(
    PKG, "oldest_xmin_age_seconds", "Age of the oldest open transaction.", ("shard",), "max"
)


def shard_health(conn: psycopg.Connection) -> dict[str, float]:
    """Dead tuples, HOT-update ratio and oldest open transaction's age (s) of one shard."""
    dead, hot, xmin = conn.execute(reads.shard_health()).fetchone()
    return {
        "dead_tuples": int(dead),
        "hot_update_ratio": float(hot),
        "oldest_xmin_age_s": float(xmin),
    }


def refresh(wh: Warehouse, cap: int = 100_000) -> dict[str, Any]:
    """Read queue and shard health from every reachable shard into the gauges; return the status."""
    st = wh.status(cap=cap, fingerprints=False)
    for entry in st["shards"]:
        if not entry["ok"]:
            continue
        shard = str(entry["shard"])
        for table, t in entry["tables"].items():
            for job, q in t["jobs"].items():
                labels = (table, job, shard)
                backlog.labels(*labels).set(q["ready"])
                leased.labels(*labels).set(q["leased"])
                backing_off.labels(*labels).set(q["backing_off"])
                oldest_ready.labels(*labels).set(q["oldest_ready_s"])
        try:
            with wh.cluster.connection(entry["shard"]) as conn:
                health = shard_health(conn)
        except psycopg.Error:
            continue
        entry["health"] = health
        dead_tuples.labels(shard).set(health["dead_tuples"])
        hot_ratio.labels(shard).set(health["hot_update_ratio"])
        xmin_age.labels(shard).set(health["oldest_xmin_age_s"])
    return st
