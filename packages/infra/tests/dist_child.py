"""One gloo rank for the straggler and hang tests.

Usage: python dist_child.py MODE RANK WORK_DIR COLLECTIVE_TIMEOUT_S, MODE one of
``straggler`` (rank 1 works 15x longer per step; each rank writes its verdicts) and
``hang`` (rank 1 stops in the middle of step 3; rank 0 waits in all_reduce; both
watchdogs write the bundle and end their process).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from krea2.infra.stragglers import StragglerConfig, StragglerDetector
from krea2.infra.watchdog import HangWatchdog, hang_timeout

WORLD = 2


def straggler(rank: int, work: Path) -> None:
    cfg = StragglerConfig(window=4, expected_step_s=0.01)
    detector = StragglerDetector(cfg, rank=rank, world=WORLD)
    verdicts = []
    for _ in range(8):
        start = time.perf_counter()
        time.sleep(0.15 if rank == 1 else 0.01)  # the local work; rank 1 is the straggler
        report = detector.record(time.perf_counter() - start)  # a collective every 4 steps
        dist.all_reduce(torch.ones(1))  # the synchronous step every rank waits on
        if report is not None:
            verdicts.append(
                {
                    "stragglers": report.stragglers,
                    "relative": [s.relative for s in report.scores],
                    "absolute": [s.absolute for s in report.scores],
                }
            )
    (work / f"straggler-{rank}.json").write_text(json.dumps(verdicts))


def hang_here() -> None:
    time.sleep(120)  # stands for a rank stuck in a kernel, a dead NIC or a deadlock


def hang(rank: int, work: Path, collective_timeout_s: float) -> None:
    watchdog = HangWatchdog(work / "bundle", hang_timeout(collective_timeout_s), rank=rank)
    watchdog.start()
    for step in range(10):
        if rank == 1 and step == 3:
            hang_here()
        dist.all_reduce(torch.ones(1))
        watchdog.beat(step, {"loss": 1.0 / (step + 1), "step": step})
    watchdog.stop()


def main() -> None:
    mode, rank, work, timeout_s = (
        sys.argv[1],
        int(sys.argv[2]),
        Path(sys.argv[3]),
        float(sys.argv[4]),
    )
    dist.init_process_group(
        "gloo",
        init_method=f"file://{work}/rendezvous",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=timeout_s),  # the collective timeout, from config
    )
    if mode == "straggler":
        straggler(rank, work)
        dist.barrier()
        dist.destroy_process_group()
    else:
        hang(rank, work, timeout_s)


if __name__ == "__main__":
    main()
