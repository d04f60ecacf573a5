"""Autoscaled krablet workers: one Deployment per job, scaled on the job's backlog.

The report's curation workers scale on a Prometheus backlog metric and give way when
research claims the GPU pool. Rendered objects:

* an interruptible ``PriorityClass`` (low value, never preempts): training pods preempt
  workers, workers never preempt anything;
* the backlog exporter (``krea2 krablet exporter``: ``krea2_krablet_backlog_rows`` per
  table, job and shard, read through the queue index) as a Deployment and a Service
  annotated for scraping;
* per job, a worker Deployment (``krea2 krablet worker --job TABLE.JOB``; SIGTERM
  finishes or releases its claims, so a preempted worker loses no rows) and either a
  KEDA ``ScaledObject`` with a Prometheus trigger (scales to zero) or an
  ``autoscaling/v2`` HPA on the external metric served by the Prometheus adapter.

Desired replicas = ceil(backlog / rows_per_worker), between min and max.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krea2.infra.config import load_section
from krea2.infra.k8s.manifests import ROLE_LABEL, object_meta

BACKLOG_METRIC = "krea2_krablet_backlog_rows"
_JOB = re.compile(r"^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$")


@dataclass
class WorkerJob:
    """One krablet job's worker pool."""

    min_replicas: int = 0  # KEDA scales to zero; the HPA needs at least 1
    max_replicas: int = 32
    rows_per_worker: int = 2000  # backlog one worker is expected to hold
    batch_size: int = 32
    concurrency: int = 1
    handler: str = ""  # module:function; "" uses the job's declared handler
    cpu: str = "2"
    memory: str = "4Gi"
    gpus: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(
                f"replicas {self.min_replicas}..{self.max_replicas}: need 0 <= min <= max, max >= 1"
            )
        if self.rows_per_worker < 1:
            raise ValueError(f"rows_per_worker={self.rows_per_worker} must be at least 1")


@dataclass
class WorkersConfig:
    """``[workers]`` of a workers file: where workers run and how they scale."""

    namespace: str = "krea2-curation"
    image: str = "krea2:0.1.0"
    cluster_secret: str = "krablet-cluster"  # Secret with cluster.json (the shard DSNs)
    autoscaler: str = "keda"  # "keda" (ScaledObject) or "hpa" (Prometheus adapter)
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    priority_class: str = "krablet-interruptible"
    priority: int = 10  # below every training class
    exporter_port: int = 9300
    poll_s: int = 30  # KEDA polling interval
    cooldown_s: int = 300  # KEDA: idle time before scaling to zero
    jobs: dict[str, WorkerJob] = field(default_factory=dict)  # "table.job" -> pool

    def __post_init__(self) -> None:
        if self.autoscaler not in ("keda", "hpa"):
            raise ValueError(f"autoscaler={self.autoscaler!r}: 'keda' or 'hpa'")
        for name in self.jobs:
            if not _JOB.match(name):
                raise ValueError(f"job {name!r} must be TABLE.JOB, like images.ocr")


def load_workers(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> WorkersConfig:
    return load_section(WorkersConfig, path, "workers", overrides)


def _k8s_name(job: str) -> str:
    return "krablet-" + job.replace(".", "-").replace("_", "-")


def _cluster_volume(cfg: WorkersConfig) -> tuple[list[dict], list[dict], list[dict]]:
    env = [{"name": "KRABLET_CLUSTER", "value": "/etc/krablet/cluster.json"}]
    mounts = [{"name": "cluster", "mountPath": "/etc/krablet", "readOnly": True}]
    volumes = [{"name": "cluster", "secret": {"secretName": cfg.cluster_secret}}]
    return env, mounts, volumes


def _deployment(
    cfg: WorkersConfig, name: str, replicas: int, container: dict, labels: dict[str, str]
) -> dict[str, Any]:
    env, mounts, volumes = _cluster_volume(cfg)
    container = {"name": container.pop("name"), "image": cfg.image, **container}
    container.update(env=env, volumeMounts=mounts)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(name, cfg.namespace, **labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": name, **labels}},
                "spec": {
                    "priorityClassName": cfg.priority_class,
                    # SIGTERM: the worker finishes or releases its claimed rows, then exits
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def backlog_query(job: str) -> str:
    """PromQL: the job's ready rows summed over shards (max dedupes scrapes per shard)."""
    table, _, name = job.partition(".")
    return f'sum(max by (shard) ({BACKLOG_METRIC}{{table="{table}",job="{name}"}}))'


def _scaler(cfg: WorkersConfig, job: str, pool: WorkerJob, target: str) -> dict[str, Any]:
    table, _, name = job.partition(".")
    if cfg.autoscaler == "keda":
        return {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": object_meta(target, cfg.namespace),
            "spec": {
                "scaleTargetRef": {"name": target},
                "pollingInterval": cfg.poll_s,
                "cooldownPeriod": cfg.cooldown_s,
                "minReplicaCount": pool.min_replicas,
                "maxReplicaCount": pool.max_replicas,
                "triggers": [
                    {
                        "type": "prometheus",
                        "metricType": "AverageValue",
                        "metadata": {
                            "serverAddress": cfg.prometheus_url,
                            "query": backlog_query(job),
                            "threshold": str(pool.rows_per_worker),
                            "activationThreshold": "0",
                        },
                    }
                ],
            },
        }
    metric = {
        "name": BACKLOG_METRIC,
        "selector": {"matchLabels": {"table": table, "job": name}},
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(target, cfg.namespace),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": max(1, pool.min_replicas),
            "maxReplicas": pool.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": metric,
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(pool.rows_per_worker),
                        },
                    },
                }
            ],
        },
    }


def worker_manifests(cfg: WorkersConfig) -> list[dict[str, Any]]:
    """The priority class, the backlog exporter and every job's Deployment and scaler."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": object_meta(cfg.priority_class),
            "value": cfg.priority,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": "krablet workers: interruptible, training takes their nodes",
        }
    ]
    exporter = "krablet-exporter"
    objects.append(
        _deployment(
            cfg,
            exporter,
            1,
            {
                "name": "exporter",
                "command": ["krea2", "krablet", "exporter"],
                "args": [f"--port={cfg.exporter_port}", "--host=0.0.0.0"],
                "ports": [{"name": "metrics", "containerPort": cfg.exporter_port}],
                "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
            },
            {ROLE_LABEL: "krablet"},
        )
    )
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                **object_meta(exporter, cfg.namespace),
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(cfg.exporter_port),
                },
            },
            "spec": {
                "selector": {"app.kubernetes.io/name": exporter},
                "ports": [{"name": "metrics", "port": cfg.exporter_port}],
            },
        }
    )
    for job, pool in sorted(cfg.jobs.items()):
        target = _k8s_name(job)
        args = [
            f"--job={job}",
            f"--batch-size={pool.batch_size}",
            f"--concurrency={pool.concurrency}",
        ]
        if pool.handler:
            args.append(f"--handler={pool.handler}")
        resources: dict[str, str] = {"cpu": pool.cpu, "memory": pool.memory}
        if pool.gpus:
            resources["nvidia.com/gpu"] = str(pool.gpus)
        container = {
            "name": "worker",
            "command": ["krea2", "krablet", "worker"],
            "args": args,
            "resources": {"requests": resources, "limits": dict(resources)},
        }
        replicas = max(1, pool.min_replicas) if cfg.autoscaler == "hpa" else pool.min_replicas
        objects.append(_deployment(cfg, target, replicas, container, {ROLE_LABEL: "krablet"}))
        objects.append(_scaler(cfg, job, pool, target))
    return objects
