"""Prometheus metrics for krea2: one naming rule, an HTTP exporter, multiprocess pools.

Names are ``krea2_<package>_<name>`` (for example ``krea2_krablet_claims_total``).
Metrics are created once per process and looked up again by name, so library code can
call :func:`counter` at the point of use. For worker pools set
``PROMETHEUS_MULTIPROC_DIR`` before the workers start; the exporter then serves the sum
over every worker process that wrote into that directory.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from http.server import ThreadingHTTPServer
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_lock = threading.Lock()
_metrics: dict[str, Any] = {}


def metric_name(package: str, name: str) -> str:
    """``krea2_<package>_<name>``, after checking both parts are snake_case."""
    for part, what in ((package, "package"), (name, "metric name")):
        if not _NAME.match(part):
            raise ValueError(f"{what} {part!r} must be lower snake_case, like 'claims_total'")
    return f"krea2_{package}_{name}"


def _get_or_create(
    kind: type,
    package: str,
    name: str,
    documentation: str,
    labelnames: Sequence[str],
    **kwargs: Any,
) -> Any:
    full = metric_name(package, name)
    with _lock:
        existing = _metrics.get(full)
        if existing is not None:
            if not isinstance(existing, kind) or tuple(existing._labelnames) != tuple(labelnames):
                raise ValueError(
                    f"metric {full} already exists as a {type(existing).__name__} with labels "
                    f"{existing._labelnames}"
                )
            return existing
        metric = kind(full, documentation, labelnames=tuple(labelnames), **kwargs)
        _metrics[full] = metric
        return metric


def counter(package: str, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
    """A process-wide counter ``krea2_<package>_<name>`` (end ``name`` with ``_total``)."""
    return _get_or_create(Counter, package, name, documentation, labelnames)


def gauge(
    package: str,
    name: str,
    documentation: str,
    labelnames: Sequence[str] = (),
    multiprocess_mode: str = "livesum",
) -> Gauge:
    """A process-wide gauge; ``multiprocess_mode`` says how worker values combine."""
    return _get_or_create(
        Gauge, package, name, documentation, labelnames, multiprocess_mode=multiprocess_mode
    )


def histogram(
    package: str,
    name: str,
    documentation: str,
    labelnames: Sequence[str] = (),
    buckets: Sequence[float] | None = None,
) -> Histogram:
    """A process-wide histogram (seconds by default: name it ``*_seconds``)."""
    kwargs = {"buckets": tuple(buckets)} if buckets is not None else {}
    return _get_or_create(Histogram, package, name, documentation, labelnames, **kwargs)


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def collecting_registry() -> CollectorRegistry:
    """The registry to expose: this process's, or the sum over a multiprocess directory."""
    if not multiprocess_enabled():
        return prometheus_client.REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def mark_worker_dead(pid: int | None = None) -> None:
    """Drop a finished worker's live gauges from the multiprocess directory."""
    if multiprocess_enabled():
        multiprocess.mark_process_dead(pid or os.getpid())


class Exporter:
    """A running ``/metrics`` HTTP endpoint; ``port`` is the bound port."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread
        self.host, self.port = server.server_address[:2]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_exporter(port: int = 0, host: str = "127.0.0.1") -> Exporter:
    """Serve ``/metrics`` in a daemon thread. ``port=0`` picks a free port.

    Binds to loopback by default; pass ``host="0.0.0.0"`` for a Prometheus scraper on
    another machine.
    """
    server, thread = prometheus_client.start_http_server(
        port, addr=host, registry=collecting_registry()
    )
    return Exporter(server, thread)


def exported_names() -> set[str]:
    """The sample names this process's krea2 metrics expose (``_total``, ``_bucket``, ...).

    Dashboards and alert rules refer to these; their tests check every query against them.
    """
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),
    }
    with _lock:
        metrics = list(_metrics.values())
    return {
        metric._name + suffix for metric in metrics for suffix in suffixes.get(metric._type, ("",))
    }
