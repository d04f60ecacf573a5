"""Node telemetry as a DaemonSet, and the alert rules as a ConfigMap for Prometheus.

The DaemonSet runs ``krea2 infra telemetry`` on every GPU node that is not reserved for a
training run: reserved nodes get their telemetry from the training ranks themselves
(exact pod and rank labels, and no extra process on a training node, which the report
found destabilising at scale). It sees every GPU without requesting one
(``NVIDIA_VISIBLE_DEVICES=all``) and reads the host's ``/sys`` read-only.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from krea2.infra.k8s.manifests import object_meta

NAME = "krea2-telemetry"


def monitoring_manifests(
    namespace: str = "krea2-monitoring",
    image: str = "krea2:0.1.0",
    port: int = 9400,
    interval_s: float = 15.0,
    reservation_label: str = "krea2.ai/reserved-for",
    gpu_node_label: str = "nvidia.com/gpu.present",
) -> list[dict[str, Any]]:
    """The telemetry DaemonSet, its scrape Service and the alert rules ConfigMap."""
    labels = {"app.kubernetes.io/name": NAME}
    field_refs = {"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name"}
    env: list[dict[str, Any]] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    env += [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field_refs.items()]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": gpu_node_label, "operator": "Exists"},
                            {"key": reservation_label, "operator": "DoesNotExist"},
                        ]
                    }
                ]
            }
        }
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": object_meta(NAME, namespace),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": affinity,
                    "tolerations": [{"operator": "Exists"}],  # faulty nodes are watched too
                    "priorityClassName": "system-node-critical",
                    "containers": [
                        {
                            "name": "telemetry",
                            "image": image,
                            "command": ["krea2", "infra", "telemetry"],
                            "args": [
                                f"--port={port}",
                                "--host=0.0.0.0",  # the pod's own network: Prometheus scrapes it
                                f"--interval={interval_s:g}",
                                "--sysfs-root=/host/sys",
                            ],
                            "env": env,
                            "ports": [{"name": "metrics", "containerPort": port}],
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "128Mi"},
                                "limits": {"cpu": "500m", "memory": "256Mi"},
                            },
                            "securityContext": {"readOnlyRootFilesystem": True},
                            "volumeMounts": [
                                {"name": "sys", "mountPath": "/host/sys", "readOnly": True}
                            ],
                        }
                    ],
                    "volumes": [{"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            **object_meta(NAME, namespace),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)},
        },
        "spec": {
            "clusterIP": "None",
            "selector": labels,
            "ports": [{"name": "metrics", "port": port}],
        },
    }
    rules = resources.files("krea2.infra") / "deploy" / "prometheus-alerts.yaml"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta("krea2-alert-rules", namespace),
        "data": {"krea2-alerts.yaml": rules.read_text()},
    }
    return [daemonset, service, config_map]
