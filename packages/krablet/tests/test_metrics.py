"""Metrics: queue and shard health gauges and worker counters, scraped from a real exporter."""

from __future__ import annotations

import httpx

from krea2.infra.metrics import start_exporter
from krea2.krablet import Job, Table, Warehouse, Worker
from krea2.krablet import metrics as km


def test_backlog_counters_and_shard_health_are_exported(cluster):
    t = Table("mtab", columns={"done": "boolean"}, jobs=[Job("mark", result="done")])
    wh = Warehouse.open(cluster, tables=[t])
    with wh.funnel() as f:
        f.upsert("mtab", [{"key": f"k{i}"} for i in range(120)])
    st = km.refresh(wh)
    assert sum(s["tables"]["mtab"]["jobs"]["mark"]["ready"] for s in st["shards"]) == 120
    assert all("oldest_xmin_age_s" in s["health"] for s in st["shards"])
    w = Worker(wh, "mtab", "mark", lambda rows: [{"done": True} for _ in rows], batch_size=10)
    w.run(until_empty=True)
    km.refresh(wh)
    exporter = start_exporter(port=0)
    try:
        text = httpx.get(exporter.url).text
    finally:
        exporter.close()
    assert 'krea2_krablet_backlog_rows{job="mark",shard="0",table="mtab"} 0.0' in text
    done = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('krea2_krablet_completed_rows_total{job="mark"')
    )
    assert done == 120
    assert "krea2_krablet_claim_seconds_bucket" in text
    assert (
        "krea2_krablet_hot_update_ratio" in text and "krea2_krablet_oldest_xmin_age_seconds" in text
    )


def test_exporter_once_prints_each_jobs_backlog_per_shard(cluster):
    from typer.testing import CliRunner

    from krea2.krablet.cli import app

    t = Table("etab", columns={"done": "boolean"}, jobs=[Job("mark", result="done")])
    wh = Warehouse.open(cluster, tables=[t])
    with wh.funnel() as f:
        f.upsert("etab", [{"key": f"k{i}"} for i in range(40)])
    wh.close()
    result = CliRunner().invoke(app, ["exporter", "--cluster", ",".join(cluster.shards), "--once"])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if "etab.mark" in ln]
    assert len(lines) == 2  # one per shard
    assert sum(int(ln.split("backlog ")[1].split(",")[0]) for ln in lines) == 40
