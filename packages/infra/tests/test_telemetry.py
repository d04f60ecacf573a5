"""GPU and fabric telemetry: readings, exported metrics, the per-window XID counter, alerts,
and ``krea2 infra telemetry --once`` with and without GPUs (a fake NVML, fixture sysfs)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pynvml
import pytest
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from krea2.infra.alerts import alert_names
from krea2.infra.cli import app
from krea2.infra.extras import MissingExtraError
from krea2.infra.fabric import read_ib_ports
from krea2.infra.gpu import NvmlReader
from krea2.infra.telemetry import (
    Identity,
    TelemetryCollector,
    TelemetryConfig,
    start_rank_telemetry,
)

sys.path.insert(0, str(Path(__file__).parent))  # the fake NVML, under importlib mode
from fake_nvml import FakeGpu, FakeNvml

SYSFS = Path(__file__).parent / "data" / "sysfs"


def hot_and_faulty() -> FakeGpu:
    """81 °C and thermally throttled, XIDs 79 and 48 pending, rows remapped, PCIe replays."""
    return FakeGpu(
        temperature_c=81,
        throttle_mask=pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
        xids=[79, 48, 48],
        remapped=(4, 2, 0, 0),
        pcie_replays=530,
    )


def sample(name: str, labels: dict[str, str]) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def collector(nvml: FakeNvml, pod: str, sysfs: Path = SYSFS, **cfg) -> TelemetryCollector:
    config = TelemetryConfig(sysfs_root=sysfs, **cfg)
    return TelemetryCollector(config, Identity(node="node-a", pod=pod, rank="3"), nvml=nvml)


def test_ib_ports_are_read_from_the_fixture_tree():
    ports = {p.device: p for p in read_ib_ports(SYSFS)}
    assert sorted(ports) == ["mlx5_0", "mlx5_10", "mlx5_11"]
    assert ports["mlx5_0"].up and ports["mlx5_0"].errors() == {}
    assert ports["mlx5_0"].counters["port_rcv_data"] == 81234567890
    assert ports["mlx5_0"].counters["np_cnp_sent"] == 17  # hw_counters are read too
    assert ports["mlx5_10"].errors() == {"link_downed": 3, "port_rcv_errors": 5, "symbol_error": 12}
    assert not ports["mlx5_11"].up and ports["mlx5_11"].state == "DOWN"
    assert read_ib_ports(SYSFS / "missing") == []


def test_reader_gives_the_report_field_set_in_base_units():
    nvml = FakeNvml([FakeGpu(), hot_and_faulty()])
    reader = NvmlReader(nvml)
    first, hot = reader.read()
    assert first.temperature_c == 55 and first.utilization == pytest.approx(0.97)
    assert first.tensor_active is None  # GPM needs two samples: the first read is the baseline
    assert first.fb_used_bytes == 120 * 2**30 and first.power_w == 650.0
    assert first.sm_clock_hz == 1980e6 and first.name == "NVIDIA H200"
    assert hot.throttle_reasons == ("hw_thermal",) and hot.thermal_throttled
    assert hot.xid_events == {79: 1, 48: 2}
    assert (hot.remapped_correctable, hot.remapped_uncorrectable) == (4, 2)
    assert hot.nvlink_errors == {
        (0, k): 0 for k in ("replay", "recovery", "crc_flit", "crc_data")
    } | {(1, k): 0 for k in ("replay", "recovery", "crc_flit", "crc_data")}
    again = reader.read()
    assert again[0].tensor_active == pytest.approx(0.715)
    assert again[1].xid_events == {}  # drained: each read sees only its own window's events
    reader.close()
    assert "shutdown" in nvml.calls


def test_metrics_carry_node_pod_rank_and_gpu_labels():
    c = collector(FakeNvml([FakeGpu(), hot_and_faulty()]), pod="train-0-labels")
    c.collect()
    gpu1 = {"node": "node-a", "pod": "train-0-labels", "rank": "3", "gpu": "1"}
    assert sample("krea2_infra_gpu_temperature_celsius", gpu1) == 81
    assert sample("krea2_infra_gpu_throttle_active", gpu1 | {"reason": "hw_thermal"}) == 1
    assert sample("krea2_infra_gpu_throttle_active", gpu1 | {"reason": "sw_power_cap"}) == 0
    assert sample("krea2_infra_gpu_remapped_rows_uncorrectable", gpu1) == 2
    assert sample("krea2_infra_gpu_pcie_replays_total", gpu1) == 530
    port = {"node": "node-a", "pod": "train-0-labels", "device": "mlx5_10", "port": "1"}
    assert sample("krea2_infra_ib_port_counter_total", port | {"counter": "symbol_error"}) == 12
    assert sample("krea2_infra_ib_port_up", port) == 1
    c.stop()


def test_xid_window_gauge_resets_while_the_total_keeps_counting():
    gpu = FakeGpu(xids=[79])
    c = collector(FakeNvml([gpu]), pod="train-0-xid")
    labels = {"node": "node-a", "pod": "train-0-xid", "rank": "3", "gpu": "0", "xid": "79"}
    c.collect()
    assert sample("krea2_infra_gpu_xid_window_events", labels) == 1
    assert sample("krea2_infra_gpu_xid_events_total", labels) == 1
    c.collect()  # a window without events
    assert sample("krea2_infra_gpu_xid_window_events", labels) == 0
    assert sample("krea2_infra_gpu_xid_events_total", labels) == 1
    gpu.xids.extend([79, 79])
    c.collect()
    assert sample("krea2_infra_gpu_xid_window_events", labels) == 2
    assert sample("krea2_infra_gpu_xid_events_total", labels) == 3


def test_counter_alerts_judge_the_increase_of_each_window(tmp_path):
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS, sysfs)
    c = collector(FakeNvml([FakeGpu()]), pod="train-0-window", sysfs=sysfs)
    first = c.alerts(c.collect())  # totals since the counters were cleared
    assert {a.name for a in first} == {"IbLinkFlapping", "IbPortErrors", "IbPortDown"}
    quiet = c.alerts(c.collect())  # nothing grew: only the port that is down still fires
    assert [a.name for a in quiet] == ["IbPortDown"]
    (sysfs / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("4\n")
    grew = [a for a in c.alerts(c.collect()) if a.name == "IbPortErrors"]
    assert [(a.subject, a.message) for a in grew] == [
        ("mlx5_0 port 1", "symbol_error=4 in this window")
    ]
    port = {"node": "node-a", "pod": "train-0-window", "device": "mlx5_0", "port": "1"}
    assert sample("krea2_infra_ib_port_counter_total", port | {"counter": "symbol_error"}) == 4


def test_throttle_warning_threshold_is_configurable():
    warm = FakeNvml([FakeGpu(temperature_c=72)])
    default = collector(warm, pod="train-0-temp", sysfs=SYSFS / "none")
    assert default.alerts(default.collect()) == []  # 72 °C is below the default 75 °C
    strict = collector(warm, pod="train-0-temp", sysfs=SYSFS / "none", throttle_warning_c=70)
    [alert] = strict.alerts(strict.collect())
    assert alert.name == "GpuTemperatureHigh" and "72 °C >= 70 °C" in alert.message


def test_a_gpu_stuck_at_a_few_gib_while_the_others_filled_up_is_flagged():
    nvml = FakeNvml([FakeGpu(), FakeGpu(fb_used=5 * 2**30)])
    c = collector(nvml, pod="train-0-fb", sysfs=SYSFS / "none")
    [alert] = c.alerts(c.collect())
    assert (alert.name, alert.subject) == ("GpuFramebufferStuck", "gpu 1")


def test_pcie_burst_and_nvlink_errors_are_flagged_per_gpu():
    gpu = FakeGpu(pcie_replays=10, nvlink_errors={(1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 2})
    c = collector(FakeNvml([FakeGpu(), gpu]), pod="train-0-pcie", sysfs=SYSFS / "none")
    first = c.alerts(c.collect())
    assert [(a.name, a.subject) for a in first] == [("GpuNvlinkErrors", "gpu 1")]
    gpu.pcie_replays = 400  # a burst of 390 in one window
    burst = c.alerts(c.collect())
    assert [(a.name, a.subject) for a in burst] == [("GpuPcieReplayBurst", "gpu 1")]


def test_once_without_gpus_reports_them_absent_and_succeeds(monkeypatch):
    driverless = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setitem(sys.modules, "pynvml", driverless)
    result = CliRunner().invoke(app, ["telemetry", "--once", "--sysfs-root", "/nonexistent"])
    assert result.exit_code == 0, result.output
    assert "no GPU: NVML could not start (Driver Not Loaded)" in result.output
    assert "no InfiniBand ports" in result.output
    assert "alerts: 0 (healthy)" in result.output


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this host has a GPU")
def test_once_with_the_real_nvml_on_a_cpu_host_says_no_gpu():
    result = CliRunner().invoke(app, ["telemetry", "--once", "--sysfs-root", "/nonexistent"])
    assert result.exit_code == 0, result.output
    assert "no GPU: NVML could not start" in result.output


def test_once_against_fixtures_prints_temperatures_xids_ib_errors_and_alerts(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(), hot_and_faulty()]))
    result = CliRunner().invoke(app, ["telemetry", "--once", "--sysfs-root", str(SYSFS)])
    print(result.output)
    assert result.exit_code == 1  # critical alerts fail a pre-flight check
    out = result.output
    assert "gpu 0 NVIDIA H200: 55 °C" in out and "gpu 1 NVIDIA H200: 81 °C" in out
    assert "XIDs 48 x2, 79 x1" in out
    assert "ib mlx5_10 port 1: ACTIVE/LinkUp" in out
    assert "link_downed=3, port_rcv_errors=5, symbol_error=12" in out
    raised = {
        line.split()[1] for line in out.splitlines() if line.startswith(("  CRITICAL", "  WARNING"))
    }
    assert raised == {
        "GpuTemperatureHigh",
        "GpuThermalThrottling",
        "GpuXidError",
        "GpuUncorrectableRemappedRows",
        "GpuPcieReplayBurst",
        "IbLinkFlapping",
        "IbPortErrors",
        "IbPortDown",
    }
    assert raised <= set(alert_names())
    assert "XID 79 x1: GPU has fallen off the bus" in out


def test_a_missing_gpu_extra_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(MissingExtraError, match=r"krea2-infra\[gpu\]"):
        NvmlReader()


def test_a_launched_rank_exports_its_own_gpu_with_its_pod_and_rank():
    env = {"KREA2_TELEMETRY_INTERVAL_S": "3600", "NODE_NAME": "n9", "POD_NAME": "job-0-1"}
    env["RANK"] = "9"
    collector = start_rank_telemetry(1, env, nvml=FakeNvml([FakeGpu(), hot_and_faulty()]))
    try:
        assert collector.config.devices == [1] and not collector.config.read_fabric
        labels = {"node": "n9", "pod": "job-0-1", "rank": "9", "gpu": "1"}
        for _ in range(100):  # the background thread's first read
            if sample("krea2_infra_gpu_temperature_celsius", labels) is not None:
                break
            time.sleep(0.05)
        assert sample("krea2_infra_gpu_temperature_celsius", labels) == 81
        assert sample("krea2_infra_gpu_temperature_celsius", labels | {"gpu": "0"}) is None
    finally:
        collector.stop()


def test_rank_telemetry_is_off_unless_launched_and_never_fails_a_run():
    assert start_rank_telemetry(0, {}) is None
    driverless = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert start_rank_telemetry(0, {"KREA2_TELEMETRY_INTERVAL_S": "15"}, nvml=driverless) is None
