"""One telemetry scrape and the thresholds it is judged by: what the collector produces
(:mod:`krea2.infra.telemetry`) and the alerts read (:mod:`krea2.infra.alerts`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from krea2.infra.fabric import SYSFS_ROOT, IbPort
from krea2.infra.gpu import GpuReading


@dataclass
class TelemetryConfig:
    """Alert thresholds and where to read. Temperatures in °C, sizes in bytes."""

    throttle_warning_c: float = 75.0  # the report: instability above 75-78 °C
    pcie_replay_burst: int = 100  # replays in one window on one GPU
    fb_stuck_bytes: int = 6 * 2**30  # a GPU stuck near 5 GiB ...
    fb_busy_bytes: int = 40 * 2**30  # ... while its neighbours filled up
    sysfs_root: Path = SYSFS_ROOT
    devices: list[int] | None = None  # GPU indices to read; None: all (a DaemonSet)
    interval_s: float = 15.0  # scrape window of the background loop
    read_fabric: bool = True  # IB ports are per node: one reader per node, not per rank


@dataclass
class Snapshot:
    """One scrape: readings plus how much each cumulative counter grew since the last."""

    gpus: list[GpuReading]
    ib_ports: list[IbPort]
    gpu_absent_reason: str | None
    first: bool  # no earlier snapshot: increases are totals since the counters were cleared
    increases: dict[tuple, int] = field(default_factory=dict)

    def increase(self, key: tuple) -> int:
        return self.increases.get(key, 0)

    @property
    def window_text(self) -> str:
        return "since the counters were last cleared" if self.first else "in this window"
