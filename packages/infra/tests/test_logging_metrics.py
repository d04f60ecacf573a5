"""Logging setup (rich / JSON lines, rank-aware) and the Prometheus layer over loopback."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import urllib.request

import pytest

from krea2.infra.logging import get_logger, setup_logging
from krea2.infra.metrics import counter, gauge, histogram, metric_name, start_exporter


def test_json_lines_carry_rank_pid_and_extras(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    log_file = tmp_path / "run.jsonl"
    setup_logging("INFO", json_lines=True, file=log_file)
    get_logger("trainer.loop").info("step done", extra={"step": 12, "loss": 0.25})
    record = json.loads(log_file.read_text().splitlines()[-1])
    assert record["message"] == "step done"
    assert record["logger"] == "krea2.trainer.loop"
    assert record["rank"] == 3
    assert record["pid"] == os.getpid()
    assert record["step"] == 12 and record["loss"] == 0.25
    setup_logging("WARNING")  # reconfiguring replaces the handlers instead of stacking them
    get_logger("x").info("hidden")
    assert "hidden" not in log_file.read_text()


def test_metric_names_follow_the_convention():
    assert metric_name("krablet", "claims_total") == "krea2_krablet_claims_total"
    with pytest.raises(ValueError, match="snake_case"):
        metric_name("Krablet", "claims")


def test_same_metric_is_returned_twice_and_kind_conflicts_fail():
    a = counter("infra", "lookups_total", "doc", ["job"])
    assert counter("infra", "lookups_total", "doc", ["job"]) is a
    with pytest.raises(ValueError, match="already exists"):
        gauge("infra", "lookups_total", "doc", ["job"])


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("krea2_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_exporter_serves_metrics_over_loopback():
    c = counter("infra", "scraped_total", "doc", ["shard"])
    h = histogram("infra", "claim_seconds", "doc", buckets=[0.1, 1.0])
    c.labels("0").inc(5)
    h.observe(0.5)
    exporter = start_exporter()
    try:
        assert exporter.host == "127.0.0.1"
        values = scrape(exporter.url)
        assert values['krea2_infra_scraped_total{shard="0"}'] == 5.0
        assert values['krea2_infra_claim_seconds_bucket{le="1.0"}'] == 1.0
        assert values['krea2_infra_claim_seconds_bucket{le="0.1"}'] == 0.0
    finally:
        exporter.close()


def _worker(n: int) -> None:
    from krea2.infra.metrics import counter, mark_worker_dead

    counter("infra", "jobs_done_total", "doc").inc(n)
    mark_worker_dead()


def test_multiprocess_mode_sums_worker_processes(tmp_path):
    code = f"""
import os, multiprocessing as mp, json, urllib.request
os.environ["PROMETHEUS_MULTIPROC_DIR"] = {str(tmp_path)!r}
import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_logging_metrics import _worker, scrape
from krea2.infra.metrics import start_exporter
ctx = mp.get_context("spawn")
procs = [ctx.Process(target=_worker, args=(n,)) for n in (2, 3, 4)]
[p.start() for p in procs]; [p.join() for p in procs]
e = start_exporter()
print(json.dumps(scrape(e.url)))
e.close()
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    values = json.loads(out.stdout.strip().splitlines()[-1])
    assert values["krea2_infra_jobs_done_total"] == 9.0
    assert mp  # spawn context is used inside the subprocess
