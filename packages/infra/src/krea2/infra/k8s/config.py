"""The ``[launch]`` and ``[workers]`` tables of a run file, and what launch reads from the rest.

A run file is the trainer's job TOML plus a ``[launch]`` table (cluster placement), so one
file says what to train and where. The launch side never imports the trainer: it reads
the few job keys it needs (``run_dir``, ``parallel.tp``, ``parallel.timeout_s``,
``observe.prometheus_port``) from the TOML as data.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krea2.infra.config import ConfigError, load_section

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# Variable names that hold credentials (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...).
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.I
)


@dataclass
class Toleration:
    key: str
    operator: str = "Exists"  # or "Equal" with a value
    value: str = ""
    effect: str = "NoSchedule"


def _default_tolerations() -> list[Toleration]:
    return [Toleration("nvidia.com/gpu")]


def _default_env() -> dict[str, str]:
    # Async error handling tears the communicator down on a timeout instead of hanging;
    # the flight recorder dumps the last collectives of every rank (the hang bundle's
    # companion on NCCL).
    return {
        "NCCL_DEBUG": "WARN",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "PYTHONFAULTHANDLER": "1",
    }


@dataclass
class LaunchConfig:
    """Where and how a run is placed on the cluster (``[launch]`` of a run file)."""

    name: str = ""  # JobSet name; "" takes the run file's stem (krea2-12b)
    namespace: str = "krea2-research"
    image: str = "krea2:0.1.0"
    nodes: int = 1
    gpus_per_node: int = 8
    cpu: str = "96"  # requests = limits per pod (one pod per node)
    memory: str = "1000Gi"
    shm: str = "256Gi"  # /dev/shm for dataloader workers and NCCL
    extra_resources: dict[str, str] = field(default_factory=dict)  # e.g. rdma/ib = "8"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Toleration] = field(default_factory=_default_tolerations)
    volumes: dict[str, str] = field(default_factory=dict)  # mount path -> PVC claim name
    env: dict[str, str] = field(default_factory=_default_env)
    # Kueue: the LocalQueue (pointing at a ClusterQueue) and the two-tier priority: a
    # WorkloadPriorityClass for admission, a PriorityClass for pod preemption.
    queue: str = "research"
    cluster_queue: str = "gpu"
    priority_class: str = "research-high"
    priority: int = 1000
    # Faulty nodes carry this label (its value says why); pods never land on them
    # ("hard") or avoid them while others are free ("soft").
    faulty_label: str = "krea2.ai/faulty"
    faulty_avoidance: str = "hard"
    # Reserved nodes: launch labels the nodes it picks with reservation_label=<name>
    # and pods require it; runs of at least taint_min_nodes nodes also taint them.
    reserve_nodes: bool = False
    reservation_label: str = "krea2.ai/reserved-for"
    taint_min_nodes: int = 16
    max_restarts: int = 3  # the whole gang restarts from the last checkpoint
    rdzv_port: int = 29500
    hang_dir: str = ""  # watchdog bundles; "" -> <run_dir>/hang
    # Secrets reach the pods only from Kubernetes Secrets: NAME -> "secret-name/key"
    # (valueFrom.secretKeyRef). `env` values are plain text in the pod spec and, through the
    # run file, in a ConfigMap, so a secret-looking name there is refused.
    secret_env: dict[str, str] = field(default_factory=dict)
    # The pods' user (securityContext runAsUser/runAsGroup/fsGroup, runAsNonRoot); -1 keeps
    # the image's own user. Privilege escalation is off and every capability dropped.
    run_as_user: int = 1000

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"nodes={self.nodes}, gpus_per_node={self.gpus_per_node} must be >= 1")
        if self.faulty_avoidance not in ("hard", "soft"):
            raise ValueError(f"faulty_avoidance={self.faulty_avoidance!r}: 'hard' or 'soft'")
        secretish = sorted(k for k in self.env if _SECRET_NAME.search(k))
        if secretish:
            raise ValueError(
                f"env {secretish} look like secrets, and env values are written into the pod "
                "spec and the run's ConfigMap; put them in a Kubernetes Secret and name it in "
                'launch.secret_env (NAME = "secret-name/key")'
            )
        for name, ref in self.secret_env.items():
            secret, _, key = ref.partition("/")
            if not (_DNS_SUBDOMAIN.match(secret) and key):
                raise ValueError(
                    f"secret_env.{name}={ref!r} must be 'secret-name/key' (a Kubernetes "
                    "Secret in the run's namespace and one of its keys)"
                )
        if self.run_as_user < -1:
            raise ValueError(f"run_as_user={self.run_as_user}: a uid >= 0, or -1 (the image's)")
        for what in ("name", "namespace", "queue", "cluster_queue", "priority_class"):
            value = getattr(self, what)
            if value and not _DNS_LABEL.match(value):
                raise ValueError(
                    f"{what}={value!r} must be a DNS label (lower case, digits, '-'), "
                    "as Kubernetes names are"
                )


@dataclass
class RunFacts:
    """What launch reads from the trainer's part of the run file (plain TOML data)."""

    path: Path
    text: str  # the whole file, shipped to the pods in a ConfigMap
    run_dir: str
    tp: int
    collective_timeout_s: float
    prometheus_port: int | None


def read_run(path: str | Path) -> RunFacts:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"run file {p} does not exist")
    text = p.read_text()
    data: dict[str, Any] = tomllib.loads(text)
    parallel, observe = data.get("parallel", {}), data.get("observe", {})
    return RunFacts(
        path=p,
        text=text,
        run_dir=str(data.get("run_dir", "runs/" + p.stem)),
        tp=int(parallel.get("tp", 1)),
        collective_timeout_s=float(parallel.get("timeout_s", 600.0)),
        prometheus_port=observe.get("prometheus_port"),
    )


def load_launch(
    path: str | Path, overrides: Sequence[str] = (), nodes: int | None = None
) -> tuple[LaunchConfig, RunFacts]:
    """The run file's ``[launch]`` (with ``launch.key=value`` overrides) and its job facts."""
    extra = [f"launch.nodes={nodes}"] if nodes is not None else []
    cfg = load_section(LaunchConfig, path, "launch", [*overrides, *extra])
    run = read_run(path)
    if not cfg.name:
        cfg.name = re.sub(r"[^a-z0-9-]+", "-", run.path.stem.lower()).strip("-")[:50]
    world = cfg.nodes * cfg.gpus_per_node
    if world % run.tp:
        raise ConfigError(
            f"parallel.tp={run.tp} does not divide {cfg.nodes} nodes x {cfg.gpus_per_node} "
            f"GPUs = {world} ranks; change launch.nodes or parallel.tp"
        )
    return cfg, run
