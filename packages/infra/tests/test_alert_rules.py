"""The shipped Prometheus alert rules: well formed, every query names an exported metric,
and the host-side alerts (krea2.infra.alerts) and the cluster rules agree on names and
thresholds. ``promtool check rules`` runs too where promtool is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources

import pytest
import yaml

from krea2.infra.alerts import alert_names
from krea2.infra.metrics import exported_names
from krea2.infra.telemetry import TelemetryCollector, TelemetryConfig

RULES = resources.files("krea2.infra") / "deploy" / "prometheus-alerts.yaml"
METRIC = re.compile(r"\bkrea2_[a-z0-9_]+")


def rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def known_metrics() -> set[str]:
    """Every metric the infra collectors export (creating them registers their names)."""
    from krea2.infra import stragglers, watchdog

    TelemetryCollector(TelemetryConfig(sysfs_root=RULES.parent)).stop()
    stragglers.StragglerDetector(rank=0, world=1)
    watchdog.watchdog_metrics()
    return exported_names()


def test_every_rule_is_complete_and_uniquely_named():
    seen = set()
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"] not in seen
        seen.add(rule["alert"])
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["expr"].count("(") == rule["expr"].count(")")


def test_every_expression_names_only_exported_metrics():
    exported = known_metrics()
    for rule in rules():
        names = set(METRIC.findall(rule["expr"]))
        assert names, f"{rule['alert']} queries no krea2 metric"
        assert names <= exported, f"{rule['alert']}: {sorted(names - exported)} are not exported"


def test_host_alerts_exist_as_cluster_rules_with_the_same_thresholds():
    by_name = {r["alert"]: r for r in rules()}
    assert set(alert_names()) <= set(by_name)
    cfg = TelemetryConfig()
    assert by_name["GpuTemperatureHigh"]["expr"].endswith(f">= {cfg.throttle_warning_c:g}")
    assert by_name["GpuPcieReplayBurst"]["expr"].endswith(f">= {cfg.pcie_replay_burst}")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules():
    out = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout
