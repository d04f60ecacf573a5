"""krea2.krablet: the sharded PostgreSQL warehouse, its job queue and the pluck map API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:
    from krea2.krablet.cluster import Cluster, default_cluster_source, load_cluster
    from krea2.krablet.connections import ShardsUnreachable, ShardUnavailable
    from krea2.krablet.embedded import start_shard, stop_shard
    from krea2.krablet.funnel import Funnel, FunnelError
    from krea2.krablet.pluck import Handle, PluckTable
    from krea2.krablet.pluck_worker import PluckWorker
    from krea2.krablet.queue import Claim, Queue
    from krea2.krablet.reader import Reader
    from krea2.krablet.schema import Job, Table
    from krea2.krablet.service import FunnelClient, RpcClient, Served
    from krea2.krablet.warehouse import Warehouse
    from krea2.krablet.worker import Worker, WorkerStats

__version__ = "0.1.0"

# public name → the module defining it; imported on first use, so `import krea2.krablet` (and
# the `krea2` command, which loads every package's CLI) stays cheap
_HOMES = {
    "Claim": "queue",
    "Cluster": "cluster",
    "Funnel": "funnel",
    "FunnelClient": "service",
    "FunnelError": "funnel",
    "Handle": "pluck",
    "Job": "schema",
    "PluckTable": "pluck",
    "PluckWorker": "pluck_worker",
    "Queue": "queue",
    "Reader": "reader",
    "RpcClient": "service",
    "Served": "service",
    "ShardUnavailable": "connections",
    "ShardsUnreachable": "connections",
    "Table": "schema",
    "Warehouse": "warehouse",
    "Worker": "worker",
    "WorkerStats": "worker",
    "default_cluster_source": "cluster",
    "load_cluster": "cluster",
    "start_shard": "embedded",
    "stop_shard": "embedded",
}

__all__ = [
    "Claim",
    "Cluster",
    "Funnel",
    "FunnelClient",
    "FunnelError",
    "Handle",
    "Job",
    "PluckTable",
    "PluckWorker",
    "Queue",
    "Reader",
    "RpcClient",
    "Served",
    "ShardUnavailable",
    "ShardsUnreachable",
    "Table",
    "Warehouse",
    "Worker",
    "WorkerStats",
    "default_cluster_source",
    "load_cluster",
    "start_shard",
    "stop_shard",
]

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
