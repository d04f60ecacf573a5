"""krea2.krablet: the sharded PostgreSQL warehouse, its job queue and the pluck map API."""

from krea2.krablet.cluster import Cluster, load_cluster
from krea2.krablet.funnel import Funnel, FunnelClient, FunnelError
from krea2.krablet.queue import Claim, Queue
from krea2.krablet.rpc import Reader, RpcClient
from krea2.krablet.schema import Job, Table
from krea2.krablet.warehouse import Warehouse
from krea2.krablet.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Claim",
    "Cluster",
    "Funnel",
    "FunnelClient",
    "FunnelError",
    "Job",
    "Queue",
    "Reader",
    "RpcClient",
    "Table",
    "Warehouse",
    "Worker",
    "load_cluster",
]
