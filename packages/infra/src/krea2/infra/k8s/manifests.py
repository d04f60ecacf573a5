"""Training manifests: a JobSet running torchrun on N nodes, admitted by Kueue as one gang.

Rendered objects, in the order they are applied:

1. ``PriorityClass`` and Kueue ``WorkloadPriorityClass`` (the report's two-tier priority:
   the workload's decides admission and preemption in Kueue, the pod's in the scheduler);
2. Kueue ``LocalQueue`` in the run's namespace, pointing at the cluster's ClusterQueue;
3. a ``ConfigMap`` with the run file, mounted where the trainer reads it;
4. a headless ``Service`` for torchrun's rendezvous (stable DNS for pod 0);
5. a ``PodDisruptionBudget`` that refuses voluntary evictions (a drain) of any rank;
6. the ``JobSet``: one replicated Job of N indexed pods, one pod per node, created
   suspended: Kueue unsuspends it only when quota for all N pods is free (gang admission).
"""

from __future__ import annotations

from typing import Any

from krea2.infra.k8s.config import LaunchConfig, RunFacts
from krea2.infra.watchdog import hang_timeout

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
KUEUE_API = "kueue.x-k8s.io/v1beta1"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "node"
RUN_MOUNT = "/etc/krea2"
ROLE_LABEL = "krea2.ai/role"  # training | dev | krablet: launch avoids nodes running these


def object_meta(name: str, namespace: str | None = None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/part-of": "krea2"}}
    meta["labels"].update(labels)
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def priority_classes(cfg: LaunchConfig, description: str) -> list[dict[str, Any]]:
    """The pod PriorityClass and the Kueue WorkloadPriorityClass of one name and value."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": object_meta(cfg.priority_class),
            "value": cfg.priority,
            "globalDefault": False,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": description,
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "WorkloadPriorityClass",
            "metadata": object_meta(cfg.priority_class),
            "value": cfg.priority,
            "description": description,
        },
    ]


def local_queue(cfg: LaunchConfig) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": object_meta(cfg.queue, cfg.namespace),
        "spec": {"clusterQueue": cfg.cluster_queue},
    }


def node_affinity(cfg: LaunchConfig) -> dict[str, Any]:
    """Never (hard) or preferably not (soft) on faulty nodes; only on reserved ones."""
    avoid = {"key": cfg.faulty_label, "operator": "DoesNotExist"}
    required: list[dict[str, Any]] = []
    if cfg.reserve_nodes:
        required.append({"key": cfg.reservation_label, "operator": "In", "values": [cfg.name]})
    affinity: dict[str, Any] = {}
    if cfg.faulty_avoidance == "hard":
        required.append(avoid)
    else:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 100, "preference": {"matchExpressions": [avoid]}}
        ]
    if required:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": required}]
        }
    return affinity


def tolerations(cfg: LaunchConfig) -> list[dict[str, Any]]:
    found = []
    for t in cfg.tolerations:
        item = {"key": t.key, "operator": t.operator, "effect": t.effect}
        if t.operator == "Equal":
            item["value"] = t.value
        found.append(item)
    if cfg.reserve_nodes and cfg.nodes >= cfg.taint_min_nodes:
        found.append(
            {
                "key": cfg.reservation_label,
                "operator": "Equal",
                "value": cfg.name,
                "effect": "NoSchedule",
            }
        )
    return found


def _env(cfg: LaunchConfig, run: RunFacts) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(cfg.env.items())]
    field_refs = {
        "NODE_NAME": "spec.nodeName",
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "JOB_COMPLETION_INDEX": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
    }
    env += [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field_refs.items()]
    for k, ref in sorted(cfg.secret_env.items()):
        secret, key = ref.split("/", 1)  # checked by LaunchConfig
        env.append({"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    hang_dir = cfg.hang_dir or f"{run.run_dir.rstrip('/')}/hang"
    env += [
        {"name": "KREA2_HANG_DIR", "value": hang_dir},
        # below the collective timeout, so every rank's stacks are written first
        {"name": "KREA2_HANG_TIMEOUT_S", "value": f"{hang_timeout(run.collective_timeout_s):g}"},
        # each rank exports its own GPU's telemetry with exact pod and rank labels
        {"name": "KREA2_TELEMETRY_INTERVAL_S", "value": "15"},
    ]
    return env


def torchrun_args(cfg: LaunchConfig) -> list[str]:
    """torchrun with a static rendezvous on pod 0 of the JobSet (its headless-service DNS)."""
    master = f"{cfg.name}-{REPLICATED_JOB}-0-0.{cfg.name}"
    return [
        f"--nnodes={cfg.nodes}",
        f"--nproc-per-node={cfg.gpus_per_node}",
        "--node-rank=$(JOB_COMPLETION_INDEX)",
        f"--master-addr={master}",
        f"--master-port={cfg.rdzv_port}",
        "-m",
        "krea2.trainer",
        "--config",
        f"{RUN_MOUNT}/run.toml",
        "--resume",  # a restarted gang continues from the newest checkpoint
    ]


def security_contexts(cfg: LaunchConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod, container) securityContext: a non-root user (unless ``run_as_user`` is -1, the
    image's own), the runtime's default seccomp profile, no privilege escalation, every
    capability dropped. The root filesystem stays writable: compile and kernel caches
    write under the home directory."""
    pod: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if cfg.run_as_user >= 0:
        uid = cfg.run_as_user
        pod.update(runAsNonRoot=uid != 0, runAsUser=uid, runAsGroup=uid, fsGroup=uid)
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def pod_template(cfg: LaunchConfig, run: RunFacts) -> dict[str, Any]:
    resources = {"nvidia.com/gpu": str(cfg.gpus_per_node), "cpu": cfg.cpu, "memory": cfg.memory}
    resources.update(cfg.extra_resources)
    mounts = [
        {"name": "run", "mountPath": RUN_MOUNT, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "run", "configMap": {"name": f"{cfg.name}-run"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": cfg.shm}},
    ]
    for i, (path, claim) in enumerate(sorted(cfg.volumes.items())):
        mounts.append({"name": f"data-{i}", "mountPath": path})
        volumes.append({"name": f"data-{i}", "persistentVolumeClaim": {"claimName": claim}})
    one_per_node = {
        "labelSelector": {"matchLabels": {JOBSET_NAME_LABEL: cfg.name}},
        "topologyKey": "kubernetes.io/hostname",
    }
    pod_security, container_security = security_contexts(cfg)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": pod_security,
        "priorityClassName": cfg.priority_class,
        "terminationGracePeriodSeconds": 120,  # time to finish an async checkpoint
        "tolerations": tolerations(cfg),
        "affinity": {
            "nodeAffinity": node_affinity(cfg),
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [one_per_node]},
        },
        "containers": [
            {
                "name": "trainer",
                "image": cfg.image,
                "command": ["torchrun"],
                "args": torchrun_args(cfg),
                "env": _env(cfg, run),
                "ports": [{"name": "rdzv", "containerPort": cfg.rdzv_port}],
                "resources": {"requests": resources, "limits": dict(resources)},
                "volumeMounts": mounts,
                "securityContext": container_security,
            }
        ],
        "volumes": volumes,
    }
    if cfg.node_selector:
        spec["nodeSelector"] = dict(cfg.node_selector)
    labels = {ROLE_LABEL: "training", "krea2.ai/run": cfg.name}
    return {"metadata": {"labels": labels}, "spec": spec}


def jobset(cfg: LaunchConfig, run: RunFacts) -> dict[str, Any]:
    labels = {
        "kueue.x-k8s.io/queue-name": cfg.queue,
        "kueue.x-k8s.io/priority-class": cfg.priority_class,
        ROLE_LABEL: "training",
    }
    job = {
        "parallelism": cfg.nodes,
        "completions": cfg.nodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,  # one failed rank fails the gang; JobSet restarts all of it
        "template": pod_template(cfg, run),
    }
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": object_meta(cfg.name, cfg.namespace, **labels),
        "spec": {
            "suspend": True,  # Kueue admits (unsuspends) the whole gang at once
            "network": {
                "enableDNSHostnames": True,
                "subdomain": cfg.name,
                "publishNotReadyAddresses": True,
            },
            "failurePolicy": {"maxRestarts": cfg.max_restarts},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB]},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job}}],
        },
    }


def training_manifests(cfg: LaunchConfig, run: RunFacts) -> list[dict[str, Any]]:
    """Every object of one training run, in apply order."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(cfg.name, cfg.namespace),
        "spec": {
            "clusterIP": "None",  # headless: DNS names for each pod, used for rendezvous
            "publishNotReadyAddresses": True,
            "selector": {JOBSET_NAME_LABEL: cfg.name},
            "ports": [{"name": "rdzv", "port": cfg.rdzv_port, "targetPort": cfg.rdzv_port}],
        },
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(f"{cfg.name}-run", cfg.namespace),
        "data": {"run.toml": run.text},
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(cfg.name, cfg.namespace),
        "spec": {
            "minAvailable": cfg.nodes,
            "selector": {"matchLabels": {JOBSET_NAME_LABEL: cfg.name}},
        },
    }
    return [
        *priority_classes(cfg, "krea2 training: admitted before and preempts interruptible work"),
        local_queue(cfg),
        config_map,
        service,
        pdb,
        jobset(cfg, run),
    ]


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """A multi-document YAML stream (needs PyYAML, the ``k8s`` extra)."""
    from krea2.infra.extras import import_extra

    yaml = import_extra("yaml", "k8s")

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: Any, value: str) -> Any:
        style = "|" if "\n" in value else None  # the run file stays readable as a block
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=False, width=100)
