"""InfiniBand port counters and link state read from sysfs (``/sys/class/infiniband``).

The report calls the IB counters the most important set: fabric instability was the
largest single cause of crashes (link flapping, packet and symbol errors, congestion,
ports slower than their peers). Each port's ``counters/`` (the IBA PortCounters) and the
driver's ``hw_counters/`` are read as they are; ``root`` is configurable so tests read a
fixture tree. Data counters (``port_rcv_data``, ``port_xmit_data``) count 4-byte words,
as the IB spec defines them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SYSFS_ROOT = Path("/sys")
# Counters where any increase means trouble (errors, drops, link events), as opposed to
# traffic and congestion counters that grow in normal operation.
ERROR_COUNTERS = frozenset(
    {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
    }
)
# Counters the report lists (§6.5); hw_counters add driver-specific ones on top.
REPORT_COUNTERS = ERROR_COUNTERS | {
    "port_rcv_data",
    "port_rcv_packets",
    "port_xmit_data",
    "port_xmit_packets",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "port_xmit_wait",
}


@dataclass
class IbPort:
    """One HCA port: its state and every counter sysfs shows (cumulative values)."""

    device: str  # e.g. mlx5_0
    port: str  # e.g. 1
    state: str  # e.g. ACTIVE, DOWN
    phys_state: str  # e.g. LinkUp, Polling
    rate: str  # e.g. "400 Gb/sec (4X NDR)"
    counters: dict[str, int] = field(default_factory=dict)  # counters/ and hw_counters/

    @property
    def up(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"

    def errors(self) -> dict[str, int]:
        """The error counters that are non-zero."""
        return {k: v for k, v in self.counters.items() if k in ERROR_COUNTERS and v}


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # missing, or unreadable without root (some hw_counters)
        return ""


def _state_name(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"`` (sysfs prefixes the numeric IBA value)."""
    return text.split(":", 1)[-1].strip() if text else "UNKNOWN"


def _read_counters(folder: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    if not folder.is_dir():
        return found
    for entry in sorted(folder.iterdir()):
        text = _read_text(entry)
        try:
            found[entry.name] = int(text)
        except ValueError:
            continue  # not a number (e.g. lifespan knobs in hw_counters)
    return found


def read_ib_ports(root: Path = SYSFS_ROOT) -> list[IbPort]:
    """Every port under ``root/class/infiniband/*/ports/*`` (empty when there is no HCA)."""
    base = Path(root) / "class" / "infiniband"
    if not base.is_dir():
        return []
    ports = []
    for device in sorted(base.iterdir()):
        for port in sorted((device / "ports").glob("*")):
            counters = _read_counters(port / "counters")
            counters.update(_read_counters(port / "hw_counters"))
            ports.append(
                IbPort(
                    device=device.name,
                    port=port.name,
                    state=_state_name(_read_text(port / "state")),
                    phys_state=_state_name(_read_text(port / "phys_state")),
                    rate=_read_text(port / "rate"),
                    counters=counters,
                )
            )
    return ports
