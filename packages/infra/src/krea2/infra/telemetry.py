"""Node telemetry: GPU (NVML) and InfiniBand (sysfs) readings exported as krea2 metrics.

A :class:`TelemetryCollector` takes a :class:`Snapshot` per scrape window, turns
cumulative hardware counters into Prometheus counters (increase since the last read, a
counter reset counted from zero), exports gauges labelled by node, pod and rank, and
evaluates the alerts of :mod:`krea2.infra.alerts`. It runs as a thread in each training
rank (exact pod and rank attribution, which a node-level exporter cannot give) or as the
``krea2 infra telemetry`` DaemonSet. XID events are a per-window gauge that goes back to
zero when a window has none, plus a monotonic ``_total`` for ``increase()``.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import krea2.infra.metrics as m
from krea2.infra.alerts import Alert, evaluate
from krea2.infra.fabric import read_ib_ports
from krea2.infra.gpu import THROTTLE_REASONS, NvmlReader
from krea2.infra.logging import get_logger
from krea2.infra.snapshot import Snapshot, TelemetryConfig

log = get_logger("infra.telemetry")
PKG = "infra"
GPU = ("node", "pod", "rank", "gpu")
PORT = ("node", "pod", "device", "port")


@dataclass
class Identity:
    """Labels attributing readings to a place in the job (empty strings where unknown)."""

    node: str = ""
    pod: str = ""
    rank: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Identity:
        """Kubernetes downward API (``NODE_NAME``, ``POD_NAME``) and torchrun's ``RANK``."""
        env = dict(os.environ if env is None else env)
        return cls(
            node=env.get("NODE_NAME") or socket.gethostname(),
            pod=env.get("POD_NAME") or env.get("HOSTNAME", ""),
            rank=env.get("RANK", ""),
        )


def _gpu_metrics() -> dict[str, Any]:
    def g(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        return m.gauge(PKG, name, doc, GPU + extra, "max")

    return {
        "temperature_c": g("gpu_temperature_celsius", "GPU core temperature (°C)."),
        "utilization": g("gpu_utilization_ratio", "Fraction of time any kernel ran (0-1)."),
        "memory_utilization": g(
            "gpu_memory_utilization_ratio", "Fraction of time memory was busy."
        ),
        "tensor_active": g("gpu_tensor_active_ratio", "Fraction of SM time in tensor ops (GPM)."),
        "fb_used_bytes": g("gpu_fb_used_bytes", "Framebuffer memory in use (bytes)."),
        "fb_total_bytes": g("gpu_fb_total_bytes", "Framebuffer memory size (bytes)."),
        "power_w": g("gpu_power_watts", "Board power draw (W)."),
        "sm_clock_hz": g("gpu_sm_clock_hertz", "SM clock (Hz)."),
        "memory_clock_hz": g("gpu_memory_clock_hertz", "Memory clock (Hz)."),
        "remapped_correctable": g("gpu_remapped_rows_correctable", "Rows remapped (correctable)."),
        "remapped_uncorrectable": g(
            "gpu_remapped_rows_uncorrectable", "Rows remapped after uncorrectable errors."
        ),
        "remap_pending": g("gpu_row_remap_pending", "1 while a remap waits for a GPU reset."),
        "remap_failure": g("gpu_row_remap_failure", "1 after a row remapping failure."),
        "throttle": g(
            "gpu_throttle_active", "1 while a clock throttle reason is active.", ("reason",)
        ),
        "xid_window": g("gpu_xid_window_events", "XID events in the last scrape window.", ("xid",)),
    }


def _counters() -> dict[str, Any]:
    return {
        "xid": m.counter(PKG, "gpu_xid_events_total", "XID events.", (*GPU, "xid")),
        "pcie": m.counter(PKG, "gpu_pcie_replays_total", "PCIe replays.", GPU),
        "nvlink": m.counter(
            PKG, "gpu_nvlink_errors_total", "NVLink data-link errors.", (*GPU, "link", "error")
        ),
        "ib": m.counter(
            PKG,
            "ib_port_counter_total",
            "IB port counter (data counters in 4-byte words).",
            (*PORT, "counter"),
        ),
    }


class TelemetryCollector:
    """Reads GPUs and IB ports, exports them, and says which alerts fire.

    ``nvml``: the NVML module (default ``pynvml``; tests inject one). ``gpu_reader``
    replaces the whole GPU side; ``None`` with an NVML that cannot start means "no GPU".
    """

    def __init__(
        self,
        config: TelemetryConfig | None = None,
        identity: Identity | None = None,
        nvml: Any = None,
        gpu_reader: NvmlReader | None = None,
    ) -> None:
        self.config = config or TelemetryConfig()
        self.identity = identity or Identity.from_env()
        self.gpu = gpu_reader or NvmlReader(nvml, self.config.devices)
        self._last: dict[tuple, int] = {}
        self._seen_xids: set[tuple[str, str]] = set()
        self._gauges = _gpu_metrics()
        self._counters = _counters()
        self._port_up = m.gauge(
            PKG, "ib_port_up", "1 when the IB port is ACTIVE/LinkUp.", PORT, "max"
        )
        self._gpus = m.gauge(
            PKG, "telemetry_gpus", "GPUs the collector reads.", ("node", "pod"), "max"
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ collect
    def _grow(self, increases: dict[tuple, int], key: tuple, value: int) -> int:
        """Increase of a cumulative counter since the last read (a reset restarts at 0)."""
        before = self._last.get(key)
        self._last[key] = value
        grew = value if before is None or value < before else value - before
        increases[key] = grew
        return grew

    def collect(self) -> Snapshot:
        """Read everything once, export it, and return the snapshot."""
        first = not self._last
        gpus = self.gpu.read()
        ports = read_ib_ports(self.config.sysfs_root) if self.config.read_fabric else []
        increases: dict[tuple, int] = {}
        for g in gpus:
            if g.pcie_replays is not None:
                self._grow(increases, ("pcie", g.index), g.pcie_replays)
            for (link, kind), value in g.nvlink_errors.items():
                self._grow(increases, ("nvlink", g.index, link, kind), value)
        for p in ports:
            for name, value in p.counters.items():
                self._grow(increases, ("ib", p.device, p.port, name), value)
        snap = Snapshot(gpus, ports, self.gpu.absent_reason, first, increases)
        self._export(snap)
        return snap

    def _export(self, snap: Snapshot) -> None:
        ident = self.identity
        self._gpus.labels(ident.node, ident.pod).set(len(snap.gpus))
        seen_xids: set[tuple[str, str]] = set()
        for g in snap.gpus:
            labels = (ident.node, ident.pod, ident.rank, str(g.index))
            for attr, gauge in self._gauges.items():
                value = getattr(g, attr, None)
                if value is not None and not isinstance(value, dict | tuple):
                    gauge.labels(*labels).set(float(value))
            for reason in THROTTLE_REASONS:
                self._gauges["throttle"].labels(*labels, reason).set(
                    float(reason in g.throttle_reasons)
                )
            for xid, n in g.xid_events.items():
                self._gauges["xid_window"].labels(*labels, str(xid)).set(n)
                self._counters["xid"].labels(*labels, str(xid)).inc(n)
                seen_xids.add((str(g.index), str(xid)))
            if g.pcie_replays is not None:
                self._counters["pcie"].labels(*labels).inc(snap.increase(("pcie", g.index)))
            for link, kind in g.nvlink_errors:
                grew = snap.increase(("nvlink", g.index, link, kind))
                self._counters["nvlink"].labels(*labels, str(link), kind).inc(grew)
        # The per-window XID gauge drops back to zero once a window brings no new event.
        for gpu, xid in self._seen_xids - seen_xids:
            self._gauges["xid_window"].labels(ident.node, ident.pod, ident.rank, gpu, xid).set(0)
        self._seen_xids |= seen_xids
        for p in snap.ib_ports:
            labels = (ident.node, ident.pod, p.device, p.port)
            self._port_up.labels(*labels).set(float(p.up))
            for name in p.counters:
                grew = snap.increase(("ib", p.device, p.port, name))
                self._counters["ib"].labels(*labels, name).inc(grew)

    def alerts(self, snap: Snapshot) -> list[Alert]:
        return evaluate(snap, self.config)

    # ------------------------------------------------------------------ background
    def start(self) -> None:
        """Collect every ``interval_s`` in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="krea2-telemetry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for alert in self.alerts(self.collect()):
                    log.warning("%s", alert)
            except Exception as exc:  # telemetry must never take the job down
                log.warning("telemetry read failed: %s: %s", type(exc).__name__, exc)
            self._stop.wait(self.config.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.gpu.close()


def start_rank_telemetry(
    local_rank: int, env: dict[str, str] | None = None, nvml: Any = None
) -> TelemetryCollector | None:
    """A launched training rank's collector for its own GPU, running; None when not asked.

    ``krea2 infra launch`` sets ``KREA2_TELEMETRY_INTERVAL_S``; the rank then exports its
    GPU (``devices=[local_rank]``) with its own pod and rank labels, and local rank 0 also
    the node's IB ports. Without a GPU or the ``gpu`` extra it logs why and returns None:
    telemetry never stops a run.
    """
    env = dict(os.environ if env is None else env)
    interval = env.get("KREA2_TELEMETRY_INTERVAL_S")
    if not interval:
        return None
    from krea2.infra.extras import MissingExtraError

    config = TelemetryConfig(
        devices=[local_rank], interval_s=float(interval), read_fabric=local_rank == 0
    )
    try:
        collector = TelemetryCollector(config, Identity.from_env(env), nvml=nvml)
    except MissingExtraError as exc:
        log.warning("no GPU telemetry in this rank: %s", exc)
        return None
    if collector.gpu.absent_reason:
        log.warning("no GPU telemetry in this rank: %s", collector.gpu.absent_reason)
        collector.stop()
        return None
    collector.start()
    return collector


def format_report(snap: Snapshot, alerts: list[Alert], identity: Identity) -> str:
    """A plain-text report for a person: GPUs (or why there are none), IB ports, alerts."""
    who = f"pod {identity.pod or '-'}, rank {identity.rank or '-'}"
    lines = [f"telemetry on {identity.node or '?'} ({who})"]
    if snap.gpu_absent_reason:
        lines.append(f"no GPU: {snap.gpu_absent_reason}; GPU metrics are absent, not zero")
    for g in snap.gpus:
        fb = (
            f"{g.fb_used_bytes / 2**30:.1f}/{g.fb_total_bytes / 2**30:.1f} GiB"
            if g.fb_used_bytes is not None and g.fb_total_bytes
            else "-"
        )
        sm_mhz = None if g.sm_clock_hz is None else g.sm_clock_hz / 1e6
        xids = ", ".join(f"{x} x{n}" for x, n in sorted(g.xid_events.items())) or "none"
        lines.append(
            f"gpu {g.index} {g.name}: {_num(g.temperature_c, '°C', 0)}, "
            f"util {_pct(g.utilization)}, tensor {_pct(g.tensor_active)}, fb {fb}, "
            f"power {_num(g.power_w, 'W', 0)}, "
            f"sm {_num(sm_mhz, 'MHz', 0)}, "
            f"throttle {','.join(g.throttle_reasons) or 'none'}, XIDs {xids}, "
            f"remapped rows {g.remapped_correctable}/{g.remapped_uncorrectable} (corr/uncorr), "
            f"PCIe replays {g.pcie_replays}"
        )
        for error in g.errors:
            lines.append(f"  nvml error: {error}")
    if not snap.ib_ports:
        lines.append("no InfiniBand ports (nothing under class/infiniband)")
    for p in snap.ib_ports:
        errors = ", ".join(f"{k}={v}" for k, v in sorted(p.errors().items())) or "no errors"
        lines.append(f"ib {p.device} port {p.port}: {p.state}/{p.phys_state} {p.rate}; {errors}")
    lines.append(f"alerts: {len(alerts)}" + ("" if alerts else " (healthy)"))
    lines.extend(f"  {a}" for a in alerts)
    return "\n".join(lines)


def _num(value: float | None, unit: str, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f} {unit}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"
