"""Apply rendered manifests and node changes through the ``kubernetes`` client (``k8s`` extra).

Objects go through server-side apply (field manager ``krea2``), so a relaunch updates
what changed and leaves other managers' fields alone; custom resources (JobSet, Kueue,
KEDA) are found by the dynamic client from their apiVersion and kind. Node placement
reads the nodes and the krea2 pods running on them, then patches labels and taints as
:mod:`krea2.infra.k8s.nodes` decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from krea2.infra.extras import import_extra
from krea2.infra.k8s.config import LaunchConfig
from krea2.infra.k8s.manifests import ROLE_LABEL
from krea2.infra.k8s.nodes import NodeChange, NodeState, Taint, release, reserve
from krea2.infra.logging import get_logger

log = get_logger("infra.k8s")
FIELD_MANAGER = "krea2"


def api_client(context: str | None = None) -> Any:
    """An API client from the in-cluster service account, else the kubeconfig (``context``)."""
    kubernetes = import_extra("kubernetes", "k8s")
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(context=context)
    return kubernetes.client.ApiClient()


def node_states(client: Any) -> list[NodeState]:
    """Every node with its labels, taints, cordon, GPUs and the krea2 roles running there."""
    kubernetes = import_extra("kubernetes", "k8s")
    core = kubernetes.client.CoreV1Api(client)
    roles: dict[str, set[str]] = {}
    pods = core.list_pod_for_all_namespaces(label_selector=ROLE_LABEL)
    for pod in pods.items:
        if pod.spec.node_name and pod.status.phase in ("Pending", "Running"):
            roles.setdefault(pod.spec.node_name, set()).add(pod.metadata.labels[ROLE_LABEL])
    states = []
    for node in core.list_node().items:
        allocatable = node.status.allocatable or {}
        states.append(
            NodeState(
                name=node.metadata.name,
                labels=dict(node.metadata.labels or {}),
                taints=[Taint(t.key, t.value or "", t.effect) for t in (node.spec.taints or [])],
                unschedulable=bool(node.spec.unschedulable),
                gpus=int(allocatable.get("nvidia.com/gpu", 0)),
                roles=frozenset(roles.get(node.metadata.name, ())),
            )
        )
    return states


def apply_node_changes(
    client: Any, changes: Sequence[NodeChange], states: Sequence[NodeState]
) -> None:
    kubernetes = import_extra("kubernetes", "k8s")
    core = kubernetes.client.CoreV1Api(client)
    by_name = {s.name: s for s in states}
    for change in changes:
        core.patch_node(change.node, change.patch(by_name[change.node]))
        log.info("node %s: %s", change.node, change.patch(by_name[change.node]))


def apply_objects(client: Any, objects: Sequence[dict[str, Any]]) -> list[str]:
    """Server-side apply each object in order; returns ``kind/name`` of each."""
    dynamic = import_extra("kubernetes.dynamic", "k8s")
    dyn = dynamic.DynamicClient(client)
    done = []
    for obj in objects:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        resource.server_side_apply(
            body=obj,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        done.append(f"{obj['kind']}/{meta['name']}")
    return done


def delete_objects(client: Any, objects: Sequence[dict[str, Any]]) -> list[str]:
    """Delete the run's namespaced objects (shared priority classes and queues stay)."""
    dynamic = import_extra("kubernetes.dynamic", "k8s")
    exceptions = import_extra("kubernetes.dynamic.exceptions", "k8s")
    dyn = dynamic.DynamicClient(client)
    done = []
    for obj in reversed(objects):
        if obj["kind"] in ("PriorityClass", "WorkloadPriorityClass", "LocalQueue"):
            continue
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        try:
            resource.delete(name=meta["name"], namespace=meta.get("namespace"))
        except exceptions.NotFoundError:
            continue
        done.append(f"{obj['kind']}/{meta['name']}")
    return done


def launch(client: Any, cfg: LaunchConfig, objects: Sequence[dict[str, Any]]) -> list[str]:
    """Reserve nodes (when configured), then apply the run's objects."""
    if cfg.reserve_nodes:
        states = node_states(client)
        changes = reserve(
            states,
            cfg.name,
            cfg.nodes,
            gpus_per_node=cfg.gpus_per_node,
            faulty_label=cfg.faulty_label,
            reservation_label=cfg.reservation_label,
            taint=cfg.nodes >= cfg.taint_min_nodes,
        )
        apply_node_changes(client, changes, states)
    return apply_objects(client, objects)


def teardown(client: Any, cfg: LaunchConfig, objects: Sequence[dict[str, Any]]) -> list[str]:
    """Delete the run's objects and release its nodes' labels and taints."""
    done = delete_objects(client, objects)
    states = node_states(client)
    apply_node_changes(client, release(states, cfg.name, cfg.reservation_label), states)
    return done
