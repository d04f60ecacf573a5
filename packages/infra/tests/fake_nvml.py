"""A stand-in for the ``pynvml`` module on a host without GPUs: same calls, scripted devices.

Constants and the exception class come from the real ``pynvml`` (installed with the
``gpu`` extra), so the fake cannot drift from the values the collector is written against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml


@dataclass
class FakeGpu:
    """One scripted device; counters are cumulative like the hardware's."""

    name: str = "NVIDIA H200"
    temperature_c: int = 55
    utilization: int = 97  # percent
    memory_utilization: int = 60
    tensor_util: float = 71.5  # percent, as GPM reports it
    fb_used: int = 120 * 2**30
    fb_total: int = 141 * 2**30
    power_mw: int = 650_000
    sm_mhz: int = 1980
    mem_mhz: int = 3201
    throttle_mask: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, uncorr, pending, failure
    pcie_replays: int = 0
    nvlink_links: int = 2
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, kind) -> n
    xids: list[int] = field(default_factory=list)  # events waiting in the event set
    gpm: bool = True


class FakeNvml:
    """Module-like object: ``FakeNvml([FakeGpu(), ...])`` or ``FakeNvml(init_error=...)``."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: int | None = None):
        self.gpus = gpus or []
        self.init_error = init_error
        self.calls: list[str] = []
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlClocksThrottleReason", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.NVML_NVLINK_MAX_LINKS = 4  # probing stops at the first unsupported link anyway

    def _gpu(self, handle: int) -> FakeGpu:
        return self.gpus[handle]

    def _fail(self, code: int) -> None:
        raise pynvml.NVMLError(code)

    # lifecycle
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            self._fail(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    # identity and gauges
    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h:04d}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._gpu(h).name.encode()

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h).temperature_c

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        g = self._gpu(h)
        return SimpleNamespace(gpu=g.utilization, memory=g.memory_utilization)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self._gpu(h)
        return SimpleNamespace(used=g.fb_used, total=g.fb_total, free=g.fb_total - g.fb_used)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h).power_mw

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        g = self._gpu(h)
        return g.sm_mhz if clock == pynvml.NVML_CLOCK_SM else g.mem_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h).throttle_mask

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._gpu(h).remapped

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._gpu(h).pcie_replays

    # NVLink
    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= self._gpu(h).nvlink_links:
            self._fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, kind: int) -> int:
        return self._gpu(h).nvlink_errors.get((link, kind), 0)

    # GPM (tensor activity)
    def nvmlGpmQueryDeviceSupport(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=int(self._gpu(h).gpm))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        return SimpleNamespace(tensor_util=None)

    def nvmlGpmSampleGet(self, h: int, sample: SimpleNamespace) -> SimpleNamespace:
        sample.tensor_util = self._gpu(h).tensor_util
        return sample

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self.calls.append("gpm_free")

    def c_nvmlGpmMetricsGet_t(self) -> SimpleNamespace:
        metric = SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
        return SimpleNamespace(
            version=0, numMetrics=0, sample1=None, sample2=None, metrics=[metric]
        )

    def nvmlGpmMetricsGet(self, query: SimpleNamespace) -> SimpleNamespace:
        assert query.metrics[0].metricId == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        assert query.sample1 is not query.sample2  # two distinct samples, as NVML requires
        query.metrics[0].value = query.sample2.tensor_util
        return query

    # XID events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # a scrape never blocks on the event set
        for i, g in enumerate(self.gpus):
            if g.xids:
                xid = g.xids.pop(0)
                return SimpleNamespace(device=i, eventType=8, eventData=xid)
        self._fail(pynvml.NVML_ERROR_TIMEOUT)
        raise AssertionError("unreachable")

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls.append("event_free")
