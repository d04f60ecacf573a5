"""Every metric the shipped Grafana dashboard and Prometheus alert rules query is exported
by some krea2 package (the trainer, infra's telemetry/stragglers/watchdog, krablet)."""

from __future__ import annotations

import json
import re
from importlib import resources

import yaml

from krea2.infra.metrics import exported_names

DEPLOY = resources.files("krea2.infra") / "deploy"
METRIC = re.compile(r"\bkrea2_[a-z0-9_]+")


def every_exported_metric(tmp_path) -> set[str]:
    import krea2.krablet.metrics  # noqa: F401  (registers krea2_krablet_* at import)
    from krea2.infra import stragglers, watchdog
    from krea2.infra.telemetry import TelemetryCollector, TelemetryConfig
    from krea2.trainer.observe import MetricsLog

    MetricsLog(tmp_path / "metrics.jsonl", write=False)
    TelemetryCollector(TelemetryConfig(sysfs_root=tmp_path)).stop()
    stragglers.StragglerDetector()
    watchdog.watchdog_metrics()
    return exported_names()


def test_dashboard_and_alerts_query_only_exported_metrics(tmp_path):
    exported = every_exported_metric(tmp_path)
    panels = json.loads((DEPLOY / "grafana-dashboard.json").read_text())["panels"]
    queried = {
        (p["title"], name)
        for p in panels
        for t in p.get("targets", [])
        for name in METRIC.findall(t["expr"])
    }
    rules = yaml.safe_load((DEPLOY / "prometheus-alerts.yaml").read_text())["groups"]
    queried |= {
        (r["alert"], name) for g in rules for r in g["rules"] for name in METRIC.findall(r["expr"])
    }
    missing = sorted((where, name) for where, name in queried if name not in exported)
    assert missing == []
    assert {"krea2_trainer_loss", "krea2_krablet_backlog_rows"} <= {n for _, n in queried}
