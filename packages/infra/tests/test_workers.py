"""``krea2 infra workers --dry-run``: krablet worker Deployments autoscaled on the job
backlog (KEDA or HPA), the backlog exporter, an interruptible priority; all schema-valid."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from krea2.infra.cli import app
from krea2.infra.config import ConfigError
from krea2.infra.k8s.config import load_launch
from krea2.infra.k8s.workers import backlog_query, load_workers, worker_manifests

sys.path.insert(0, str(Path(__file__).parent))  # the validator, under importlib mode
from k8s_schema import validation_errors

ROOT = Path(__file__).resolve().parents[3]
WORKERS_FILE = ROOT / "configs" / "production" / "krablet-workers.toml"
RUN_FILE = ROOT / "configs" / "production" / "krea2-12b.toml"


def dry_run(*args: str) -> list[dict]:
    result = CliRunner().invoke(app, ["workers", str(WORKERS_FILE), "--dry-run", *args])
    assert result.exit_code == 0, result.output
    return list(yaml.safe_load_all(result.output))


@pytest.mark.parametrize("autoscaler", ["keda", "hpa"])
def test_worker_manifests_pass_the_schemas(autoscaler):
    objects = dry_run("--set", f"workers.autoscaler={autoscaler}")
    for obj in objects:
        assert validation_errors(obj) == []
    scaler = "ScaledObject" if autoscaler == "keda" else "HorizontalPodAutoscaler"
    jobs = ["images.analyze", "images.captions", "images.embed", "images.ocr"]
    assert sum(o["kind"] == scaler for o in objects) == len(jobs)
    deployments = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    assert deployments == ["krablet-exporter"] + [f"krablet-{j.replace('.', '-')}" for j in jobs]


def test_keda_scales_each_job_on_its_backlog_per_worker_from_zero():
    scaled = {o["metadata"]["name"]: o for o in dry_run() if o["kind"] == "ScaledObject"}
    ocr = scaled["krablet-images-ocr"]["spec"]
    assert ocr["scaleTargetRef"]["name"] == "krablet-images-ocr"
    assert (ocr["minReplicaCount"], ocr["maxReplicaCount"]) == (0, 32)
    [trigger] = ocr["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "5000"
    assert trigger["metadata"]["query"] == backlog_query("images.ocr")
    assert 'krea2_krablet_backlog_rows{table="images",job="ocr"}' in backlog_query("images.ocr")


def test_hpa_reads_the_external_backlog_metric_and_keeps_one_worker():
    cfg = load_workers(WORKERS_FILE, ["workers.autoscaler=hpa"])
    hpa = next(
        o
        for o in worker_manifests(cfg)
        if o["metadata"]["name"] == "krablet-images-embed"
        and o["kind"] == "HorizontalPodAutoscaler"
    )
    [metric] = hpa["spec"]["metrics"]
    assert metric["external"]["metric"] == {
        "name": "krea2_krablet_backlog_rows",
        "selector": {"matchLabels": {"table": "images", "job": "embed"}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "20000"}
    assert hpa["spec"]["minReplicas"] == 1  # an HPA cannot scale to zero


def test_workers_are_interruptible_and_training_preempts_them():
    objects = dry_run()
    [priority] = [o for o in objects if o["kind"] == "PriorityClass"]
    assert priority["preemptionPolicy"] == "Never"  # workers never evict anything
    launch, _ = load_launch(RUN_FILE)
    assert priority["value"] < launch.priority  # training pods preempt workers
    for dep in (o for o in objects if o["kind"] == "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == priority["metadata"]["name"]
        assert pod["terminationGracePeriodSeconds"] >= 30  # time to release claimed rows
    embed = next(
        o
        for o in objects
        if o["metadata"]["name"] == "krablet-images-embed" and o["kind"] == "Deployment"
    )
    container = embed["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["args"][:2] == ["--job=images.embed", "--batch-size=256"]


def test_bad_worker_settings_are_one_clear_error(tmp_path):
    bad = tmp_path / "w.toml"
    bad.write_text('[workers.jobs."images"]\nmax_replicas = 2\n')
    with pytest.raises(ConfigError, match=r"must be TABLE\.JOB"):
        load_workers(bad)
    bad.write_text('[workers.jobs."images.ocr"]\nmin_replicas = 5\nmax_replicas = 2\n')
    with pytest.raises(ConfigError, match="need 0 <= min <= max"):
        load_workers(bad)


def test_telemetry_daemonset_watches_gpu_nodes_not_reserved_for_training():
    result = CliRunner().invoke(app, ["monitoring", "--dry-run"])
    assert result.exit_code == 0, result.output
    objects = {o["kind"]: o for o in yaml.safe_load_all(result.output)}
    assert set(objects) == {"DaemonSet", "Service", "ConfigMap"}
    for obj in objects.values():
        assert validation_errors(obj) == []
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "krea2.ai/reserved-for", "operator": "DoesNotExist"} in term["matchExpressions"]
    [container] = pod["containers"]
    assert container["command"] == ["krea2", "infra", "telemetry"]
    assert "--sysfs-root=/host/sys" in container["args"]
    assert "--host=0.0.0.0" in container["args"]  # the command's own default is loopback
    rules = yaml.safe_load(objects["ConfigMap"]["data"]["krea2-alerts.yaml"])
    assert any(r["alert"] == "GpuXidError" for g in rules["groups"] for r in g["rules"])
