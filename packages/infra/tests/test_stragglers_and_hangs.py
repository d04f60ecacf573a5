"""Slow-rank scores, and on two gloo ranks: the straggler is found, and a hang leaves a
bundle with every rank's stacks before the ranks end themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from krea2.infra.stragglers import StragglerConfig, StragglerDetector, score_ranks
from krea2.infra.watchdog import HANG_EXIT_CODE, HangWatchdog, collect_env, hang_timeout

CHILD = Path(__file__).parent / "dist_child.py"


def run_ranks(
    mode: str, work: Path, collective_timeout_s: float
) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(CHILD), mode, str(rank), str(work), str(collective_timeout_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout))
    return out


def test_relative_score_flags_the_one_slow_rank():
    cfg = StragglerConfig()
    scores = score_ranks([1.0, 1.02, 0.98, 2.0], reference_s=1.0, cfg=cfg)
    assert [s.flagged for s in scores] == [False, False, False, True]
    assert scores[3].relative == pytest.approx(1.01 / 2.0)
    assert scores[2].relative == 1.0  # faster than the median caps at 1


def test_absolute_score_flags_a_job_that_slowed_down_together():
    cfg = StragglerConfig()
    scores = score_ranks([2.0, 2.0, 2.1], reference_s=1.0, cfg=cfg)
    assert all(s.relative > 0.95 for s in scores)  # nobody stands out from the others ...
    assert all(s.flagged for s in scores)  # ... but all are half as fast as the reference


def test_millisecond_jitter_is_not_a_straggler():
    scores = score_ranks([0.001, 0.004], reference_s=0.001, cfg=StragglerConfig())
    assert scores[1].relative < 0.8 and not scores[1].flagged  # 4 ms: below min_flag_s


def test_single_process_detector_learns_its_reference_from_the_best_window():
    detector = StragglerDetector(StragglerConfig(window=2), rank=0, world=1)
    assert detector.record(1.0) is None
    assert detector.record(1.0).stragglers == []
    detector.record(3.0)
    report = detector.record(3.0)
    assert report.reference_s == 1.0 and report.stragglers == [0]


def test_config_rejects_thresholds_outside_zero_one():
    with pytest.raises(ValueError, match="relative_threshold"):
        StragglerConfig(relative_threshold=1.5)


def test_hang_timeout_fires_before_the_collective_timeout():
    assert hang_timeout(1800) == 1440 and hang_timeout(600, margin=0.5) == 300


def test_a_launched_rank_gets_its_watchdog_from_the_environment(tmp_path):
    assert HangWatchdog.from_env(600, rank=0, env={}) is None  # not launched: no watchdog
    dog = HangWatchdog.from_env(600, rank=3, env={"KREA2_HANG_DIR": str(tmp_path)})
    assert (dog.bundle_dir, dog.timeout_s, dog.rank) == (tmp_path, hang_timeout(600), 3)
    env = {"KREA2_HANG_DIR": str(tmp_path), "KREA2_HANG_TIMEOUT_S": "90"}
    assert HangWatchdog.from_env(600, rank=0, env=env).timeout_s == 90


def test_env_for_the_bundle_keeps_the_distributed_variables_only():
    env = collect_env({"NCCL_DEBUG": "INFO", "TORCH_NCCL_BLOCKING_WAIT": "1", "HOME": "/root"})
    assert env == {"NCCL_DEBUG": "INFO", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_watchdog_report_mode_writes_the_bundle_and_keeps_running(tmp_path):
    dog = HangWatchdog(tmp_path, timeout_s=0.2, rank=7, on_hang="report")
    dog.start()
    dog.beat(41, {"loss": 0.5})
    assert dog.fired.wait(30)
    dog.stop()
    info = json.loads((tmp_path / "rank-00007.json").read_text())
    assert info["last_step"] == 41 and info["last_metrics"] == {"loss": 0.5}
    stacks = (tmp_path / "rank-00007.stacks.txt").read_text()
    assert "test_watchdog_report_mode_writes_the_bundle_and_keeps_running" in stacks


@pytest.mark.distributed
def test_two_gloo_ranks_find_the_slow_rank(tmp_path):
    done = run_ranks("straggler", tmp_path, collective_timeout_s=60)
    assert [p.returncode for p in done] == [0, 0], [p.stdout[-2000:] for p in done]
    for rank in range(2):  # every rank reaches the same verdict
        verdicts = json.loads((tmp_path / f"straggler-{rank}.json").read_text())
        assert len(verdicts) == 2
        for v in verdicts:
            assert v["stragglers"] == [1]
            assert v["relative"][0] == 1.0 and v["relative"][1] < 0.8
            assert v["absolute"][1] < 0.7


@pytest.mark.distributed
def test_a_hang_writes_every_ranks_stacks_before_the_ranks_exit(tmp_path):
    done = run_ranks("hang", tmp_path, collective_timeout_s=6)
    assert [p.returncode for p in done] == [HANG_EXIT_CODE] * 2, [p.stdout[-2000:] for p in done]
    bundle = tmp_path / "bundle"
    stacks = {r: (bundle / f"rank-{r:05d}.stacks.txt").read_text() for r in range(2)}
    assert "all_reduce" in stacks[0]  # rank 0 waits in the collective ...
    assert "in hang_here" in stacks[1]  # ... for rank 1, stuck in its own code
    for r in range(2):
        assert "Thread 0x" in stacks[r] and "in hang" in stacks[r]
        info = json.loads((bundle / f"rank-{r:05d}.json").read_text())
        assert info["rank"] == r and info["env"]["NCCL_DEBUG"] == "INFO"
        assert info["last_step"] == 2 and info["last_metrics"]["step"] == 2


def test_rank_health_beats_records_and_disarms(tmp_path):
    from krea2.infra.rank_health import RankHealth

    health = RankHealth(0, 1, 0, collective_timeout_s=600, env={"KREA2_HANG_DIR": str(tmp_path)})
    assert health.telemetry is None  # not asked for (no KREA2_TELEMETRY_INTERVAL_S)
    reports = [health.step(s, 0.2, {"loss": 1.0}) for s in range(20)]
    assert reports[-1] is not None and reports[-1].stragglers == []
    assert health.watchdog._step == 19 and health.watchdog.timeout_s == hang_timeout(600)
    health.close()
    assert not health.watchdog.fired.is_set()
    assert RankHealth(0, 1, 0, 600, env={}).watchdog is None  # not launched
