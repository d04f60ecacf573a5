"""GPU readings over NVML (``nvidia-ml-py``, the ``gpu`` extra): the report's DCGM field set.

One :class:`GpuReading` per device and scrape: temperature, utilisation, tensor-pipe
activity (NVML GPM, Hopper and newer, the counterpart of DCGM's
``PROF_PIPE_TENSOR_ACTIVE``), framebuffer, power, clocks and active throttle reasons,
XID events seen since the previous read, remapped rows, PCIe replays and NVLink error
counters. A field the device does not support is ``None``; a machine without a driver or
devices gives ``absent_reason`` instead of an exception, so telemetry on a CPU host
reports "no GPU" and goes on with the fabric counters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from krea2.infra.extras import import_extra

# NVML clock-event (throttle) reason bits, by the short names we export. Read from the
# module at run time so a newer NVML with renamed constants still loads.
THROTTLE_REASONS = {
    "gpu_idle": "nvmlClocksThrottleReasonGpuIdle",
    "applications_clocks": "nvmlClocksThrottleReasonApplicationsClocksSetting",
    "sw_power_cap": "nvmlClocksThrottleReasonSwPowerCap",
    "hw_slowdown": "nvmlClocksThrottleReasonHwSlowdown",
    "sync_boost": "nvmlClocksThrottleReasonSyncBoost",
    "sw_thermal": "nvmlClocksThrottleReasonSwThermalSlowdown",
    "hw_thermal": "nvmlClocksThrottleReasonHwThermalSlowdown",
    "hw_power_brake": "nvmlClocksThrottleReasonHwPowerBrakeSlowdown",
}
THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal"})
# NVLink data-link error counters (NVML_NVLINK_ERROR_DL_*): DCGM does not export these.
NVLINK_ERRORS = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}
MAX_XID_EVENTS_PER_READ = 1024  # a storm of events must not stall the scrape


@dataclass
class GpuReading:
    """One device at one scrape. Ratios are in [0, 1]; ``None``: not supported here."""

    index: int
    uuid: str
    name: str
    temperature_c: float | None = None
    utilization: float | None = None  # fraction of time any kernel ran (DCGM GPU_UTIL)
    memory_utilization: float | None = None  # fraction of time memory was read or written
    tensor_active: float | None = None  # fraction of SM time in tensor ops (GPM); None at first
    fb_used_bytes: int | None = None
    fb_total_bytes: int | None = None
    power_w: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    throttle_reasons: tuple[str, ...] = ()  # active names from THROTTLE_REASONS
    xid_events: dict[int, int] = field(default_factory=dict)  # XID -> events since last read
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_replays: int | None = None  # cumulative since the driver loaded
    nvlink_errors: dict[tuple[int, str], int] = field(default_factory=dict)  # (link, kind) -> n
    errors: list[str] = field(default_factory=list)  # NVML failures other than "not supported"

    @property
    def thermal_throttled(self) -> bool:
        return bool(THERMAL_REASONS.intersection(self.throttle_reasons))


class NvmlReader:
    """Reads every visible GPU (or ``devices``) through NVML.

    ``nvml`` is the ``pynvml`` module by default; tests pass an object with the same
    functions and constants. XID events are delivered by an NVML event set registered
    at start, drained (never waited on) at each :meth:`read`, so each reading counts
    only the events of its own scrape window.
    """

    def __init__(self, nvml: ModuleType | Any | None = None, devices: Sequence[int] | None = None):
        self.nvml = nvml if nvml is not None else import_extra("pynvml", "gpu")
        self.absent_reason: str | None = None
        self._handles: dict[int, Any] = {}
        self._events: Any = None
        self._gpm: dict[int, list[Any]] = {}  # index -> [previous sample or None, spare]
        self._links: dict[int, list[int]] = {}
        nv = self.nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            self.absent_reason = f"NVML could not start ({exc}): no NVIDIA driver on this host"
            return
        self._started = True
        count = nv.nvmlDeviceGetCount()
        wanted = range(count) if devices is None else [i for i in devices if 0 <= i < count]
        self._handles = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in wanted}
        if not self._handles:
            self.absent_reason = (
                f"NVML sees {count} GPU(s), none of them among devices {list(devices or [])}"
                if count
                else "NVML found no GPU"
            )
            return
        self._start_xid_events()
        for i, h in self._handles.items():
            self._start_gpm(i, h)
            self._links[i] = self._active_links(h)

    # ------------------------------------------------------------------ setup
    def _not_supported(self, exc: Exception) -> bool:
        return getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_SUPPORTED

    def _start_xid_events(self) -> None:
        nv = self.nvml
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return
        for h in self._handles.values():
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
            except nv.NVMLError:
                continue  # not supported on this device; the others still report

    def _start_gpm(self, index: int, handle: Any) -> None:
        nv = self.nvml
        try:
            if not nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return
            self._gpm[index] = [None, nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        except (nv.NVMLError, AttributeError):
            return  # pre-Hopper GPU or an NVML without GPM: tensor activity stays None

    def _active_links(self, handle: Any) -> list[int]:
        nv = self.nvml
        links = []
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link) == nv.NVML_FEATURE_ENABLED:
                    links.append(link)
            except nv.NVMLError:
                break  # past the last link, or no NVLink at all (PCIe cards)
        return links

    @property
    def device_count(self) -> int:
        return len(self._handles)

    # ------------------------------------------------------------------ reads
    def _call(self, reading: GpuReading, fn: str, *args: Any) -> Any:
        """``nvml.<fn>(*args)``, or None where unsupported (other failures are recorded)."""
        nv = self.nvml
        try:
            return getattr(nv, fn)(*args)
        except nv.NVMLError as exc:
            if not self._not_supported(exc):
                reading.errors.append(f"{fn}: {exc}")
            return None

    def read(self) -> list[GpuReading]:
        """One reading per device; XID counts are the events since the previous call."""
        xids = self._drain_xids()
        return [self._read_one(i, h, xids.get(i, {})) for i, h in self._handles.items()]

    def _read_one(self, index: int, h: Any, xids: dict[int, int]) -> GpuReading:
        nv = self.nvml
        uuid, name = nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetName(h)
        r = GpuReading(index=index, uuid=_text(uuid), name=_text(name), xid_events=dict(xids))
        r.temperature_c = _float(
            self._call(r, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        )
        util = self._call(r, "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            r.utilization, r.memory_utilization = util.gpu / 100.0, util.memory / 100.0
        mem = self._call(r, "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            r.fb_used_bytes, r.fb_total_bytes = int(mem.used), int(mem.total)
        power_mw = self._call(r, "nvmlDeviceGetPowerUsage", h)
        r.power_w = None if power_mw is None else power_mw / 1000.0
        sm = self._call(r, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
        memclk = self._call(r, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM)
        r.sm_clock_hz = None if sm is None else sm * 1e6  # NVML gives MHz
        r.memory_clock_hz = None if memclk is None else memclk * 1e6
        r.throttle_reasons = self._throttle(r, h)
        rows = self._call(r, "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            corr, unc, pending, failure = rows
            r.remapped_correctable, r.remapped_uncorrectable = int(corr), int(unc)
            r.remap_pending, r.remap_failure = bool(pending), bool(failure)
        r.pcie_replays = self._call(r, "nvmlDeviceGetPcieReplayCounter", h)
        r.tensor_active = self._tensor_active(r, index, h)
        for link in self._links.get(index, []):
            for kind, const in NVLINK_ERRORS.items():
                value = self._call(
                    r, "nvmlDeviceGetNvLinkErrorCounter", h, link, getattr(nv, const)
                )
                if value is not None:
                    r.nvlink_errors[(link, kind)] = int(value)
        return r

    def _throttle(self, r: GpuReading, h: Any) -> tuple[str, ...]:
        nv = self.nvml
        fn = (
            "nvmlDeviceGetCurrentClocksEventReasons"
            if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons")
            else "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        mask = self._call(r, fn, h)
        if mask is None:
            return ()
        bits = {name: getattr(nv, const, 0) for name, const in THROTTLE_REASONS.items()}
        return tuple(name for name, bit in bits.items() if bit and mask & bit)

    def _tensor_active(self, r: GpuReading, index: int, h: Any) -> float | None:
        """Tensor-pipe activity between the previous read and this one (GPM metric 5)."""
        slots = self._gpm.get(index)
        if slots is None:
            return None
        nv = self.nvml
        previous, current = slots[0], slots[2] if slots[0] is slots[1] else slots[1]
        if self._call(r, "nvmlGpmSampleGet", h, current) is None:
            return None
        slots[0] = current
        if previous is None:
            return None  # the first read only takes the baseline sample
        query = nv.c_nvmlGpmMetricsGet_t()
        query.version = nv.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = 1
        query.sample1, query.sample2 = previous, current
        query.metrics[0].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        if self._call(r, "nvmlGpmMetricsGet", query) is None or query.metrics[0].nvmlReturn:
            return None
        return float(query.metrics[0].value) / 100.0

    def _drain_xids(self) -> dict[int, dict[int, int]]:
        """Per device index, XID -> number of events delivered since the last drain."""
        if self._events is None:
            return {}
        nv = self.nvml
        found: dict[int, dict[int, int]] = {}
        for _ in range(MAX_XID_EVENTS_PER_READ):
            try:
                event = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                break  # a timeout: no event pending (any other failure: no XIDs this read)
            index = nv.nvmlDeviceGetIndex(event.device)
            per = found.setdefault(index, {})
            per[int(event.eventData)] = per.get(int(event.eventData), 0) + 1
        return found

    def close(self) -> None:
        nv = self.nvml
        if not getattr(self, "_started", False):
            return
        for slots in self._gpm.values():
            for sample in slots[1:]:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(sample)
        if self._events is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._events)
        nv.nvmlShutdown()
        self._started = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
