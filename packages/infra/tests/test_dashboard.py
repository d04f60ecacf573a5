"""The shipped Grafana dashboard: valid against the dashboard model, panels laid out without
overlap, every query valid PromQL (promtool, where installed) naming krea2 metrics, and
every infra metric it names exported by infra. (krablet's and the trainer's names are
checked in tests/test_dashboard_metrics.py, where those packages are installed.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from krea2.infra.metrics import exported_names
from krea2.infra.telemetry import TelemetryCollector, TelemetryConfig

DASHBOARD = resources.files("krea2.infra") / "deploy" / "grafana-dashboard.json"
SCHEMA = Path(__file__).parent / "data" / "schemas" / "grafana-dashboard.json"
METRIC = re.compile(r"\bkrea2_[a-z0-9_]+")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_dashboard_matches_the_grafana_model():
    jsonschema.validate(dashboard(), json.loads(SCHEMA.read_text()))


def test_the_model_check_catches_a_misspelt_panel_key():
    broken = dashboard()
    broken["panels"][1]["targetz"] = broken["panels"][1].pop("targets")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads(SCHEMA.read_text()))


def test_panels_have_unique_ids_and_do_not_overlap():
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


def test_every_query_names_krea2_metrics_and_infra_ones_exist():
    from krea2.infra import stragglers, watchdog

    TelemetryCollector(TelemetryConfig(sysfs_root=SCHEMA.parent)).stop()
    stragglers.StragglerDetector()
    watchdog.watchdog_metrics()
    exported = exported_names()
    families = {"trainer": 0, "infra": 0, "krablet": 0}
    for title, expr in queries():
        names = METRIC.findall(expr)
        assert names, f"panel {title!r} queries no krea2 metric: {expr}"
        for name in names:
            package = name.split("_")[1]
            families[package] += 1
            if package == "infra":
                assert name in exported, f"panel {title!r}: {name} is not exported by infra"
    assert all(families.values()), families  # training, telemetry and krablet all shown


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_every_query_is_valid_promql(tmp_path):
    rules = [
        {"record": f"krea2:panel_{i}", "expr": expr.replace("$node", ".*")}
        for i, (_, expr) in enumerate(queries())
    ]
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
