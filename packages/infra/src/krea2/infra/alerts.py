"""Node-health alerts over one telemetry snapshot: what the report learned to act on (§6.5).

The same alerts, by the same names, ship as Prometheus rules
(``krea2/infra/deploy/prometheus-alerts.yaml``) for a cluster; this module evaluates them
on one host without Prometheus, for ``krea2 infra telemetry --once`` and pre-flight checks
before a launch. Counter alerts judge the increase since the previous snapshot (on the
first one: since the counters were last cleared).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from krea2.infra.fabric import ERROR_COUNTERS
from krea2.infra.snapshot import Snapshot, TelemetryConfig

WARNING, CRITICAL = "warning", "critical"
# XIDs seen on training nodes and what they name (NVIDIA's XID catalog, abridged).
XID_MEANINGS = {
    13: "graphics engine exception (often an application fault)",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    48: "double-bit ECC error",
    63: "row remapping event (pending)",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
LINK_EVENTS = ("link_downed", "link_error_recovery")  # flapping, as opposed to bad packets
NVLINK_FAULTS = ("replay", "recovery", "crc_data")  # crc_flit alone is corrected in-line


@dataclass(frozen=True)
class Alert:
    """One firing alert: its rule name (as in the Prometheus rules), severity and why."""

    name: str
    severity: str
    subject: str  # "gpu 3" or "mlx5_0 port 1"
    message: str

    def __str__(self) -> str:
        return f"{self.severity.upper():8s} {self.name} [{self.subject}] {self.message}"


def gpu_alerts(snap: Snapshot, cfg: TelemetryConfig) -> list[Alert]:
    """Temperature, throttling, XIDs, memory rows, PCIe bursts, NVLink and stuck memory."""
    found: list[Alert] = []
    biggest_fb = max((g.fb_used_bytes or 0 for g in snap.gpus), default=0)
    for g in snap.gpus:
        who = f"gpu {g.index}"
        if g.temperature_c is not None and g.temperature_c >= cfg.throttle_warning_c:
            found.append(
                Alert(
                    "GpuTemperatureHigh",
                    WARNING,
                    who,
                    f"{g.temperature_c:.0f} °C >= {cfg.throttle_warning_c:.0f} °C: it will "
                    "throttle and slow every rank; move the run off this node",
                )
            )
        if g.thermal_throttled:
            reasons = ", ".join(r for r in g.throttle_reasons if "thermal" in r)
            found.append(Alert("GpuThermalThrottling", WARNING, who, f"clocks cut ({reasons})"))
        for xid, n in sorted(g.xid_events.items()):
            meaning = XID_MEANINGS.get(xid, "see NVIDIA's XID catalog")
            found.append(Alert("GpuXidError", CRITICAL, who, f"XID {xid} x{n}: {meaning}"))
        if g.remap_failure:
            found.append(
                Alert("GpuRowRemapFailure", CRITICAL, who, "row remapping failed: replace the GPU")
            )
        if g.remapped_uncorrectable:
            found.append(
                Alert(
                    "GpuUncorrectableRemappedRows",
                    CRITICAL,
                    who,
                    f"{g.remapped_uncorrectable} rows remapped after uncorrectable errors: "
                    "faulty memory, label the node faulty",
                )
            )
        if g.remap_pending:
            found.append(Alert("GpuRowRemapPending", WARNING, who, "a remap waits for a GPU reset"))
        replays = snap.increase(("pcie", g.index))
        if replays >= cfg.pcie_replay_burst:
            found.append(
                Alert(
                    "GpuPcieReplayBurst",
                    WARNING,
                    who,
                    f"{replays} PCIe replays {snap.window_text}: a burst on one GPU came "
                    "before crashes",
                )
            )
        nvlink = {
            f"link {link} {kind}": snap.increase(("nvlink", g.index, link, kind))
            for (link, kind) in g.nvlink_errors
            if kind in NVLINK_FAULTS
        }
        nvlink = {k: v for k, v in nvlink.items() if v}
        if nvlink:
            text = ", ".join(f"{k}={v}" for k, v in nvlink.items())
            found.append(Alert("GpuNvlinkErrors", WARNING, who, f"{text} {snap.window_text}"))
        used = g.fb_used_bytes
        if used is not None and used < cfg.fb_stuck_bytes and biggest_fb > cfg.fb_busy_bytes:
            found.append(
                Alert(
                    "GpuFramebufferStuck",
                    WARNING,
                    who,
                    f"{used / 2**30:.1f} GiB used while another GPU here holds "
                    f"{biggest_fb / 2**30:.1f} GiB: stuck allocation, reboot the node",
                )
            )
    return found


def fabric_alerts(snap: Snapshot) -> list[Alert]:
    """IB ports down, link flapping (downed/recovery events) and packet errors."""
    found: list[Alert] = []
    for p in snap.ib_ports:
        who = f"{p.device} port {p.port}"
        if not p.up:
            found.append(
                Alert("IbPortDown", CRITICAL, who, f"state {p.state}, physical {p.phys_state}")
            )
        grew = {
            name: snap.increase(("ib", p.device, p.port, name))
            for name in p.counters
            if name in ERROR_COUNTERS
        }
        flaps = {k: grew[k] for k in LINK_EVENTS if grew.get(k)}
        if flaps:
            text = ", ".join(f"{k}={v}" for k, v in flaps.items())
            found.append(Alert("IbLinkFlapping", CRITICAL, who, f"{text} {snap.window_text}"))
        errors = {k: v for k, v in grew.items() if v and k not in LINK_EVENTS}
        if errors:
            text = ", ".join(f"{k}={v}" for k, v in sorted(errors.items()))
            found.append(Alert("IbPortErrors", WARNING, who, f"{text} {snap.window_text}"))
    return found


def evaluate(snap: Snapshot, cfg: TelemetryConfig) -> list[Alert]:
    """Every firing alert, critical first."""
    found = gpu_alerts(snap, cfg) + fabric_alerts(snap)
    return sorted(found, key=lambda a: a.severity != CRITICAL)


def alert_names() -> Sequence[str]:
    """Names this module can raise (each must exist in the shipped Prometheus rules)."""
    return (
        "GpuTemperatureHigh",
        "GpuThermalThrottling",
        "GpuXidError",
        "GpuRowRemapFailure",
        "GpuUncorrectableRemappedRows",
        "GpuRowRemapPending",
        "GpuPcieReplayBurst",
        "GpuNvlinkErrors",
        "GpuFramebufferStuck",
        "IbPortDown",
        "IbLinkFlapping",
        "IbPortErrors",
    )
