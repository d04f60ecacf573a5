"""``parallel.keep_freed_memory``: a CPU job's process keeps freed malloc blocks or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = """
import json, sys
from krea2.infra import heap
from krea2.trainer.config import JobConfig, ParallelConfig, StageConfig
from krea2.trainer.distributed import init_distributed
keep = sys.argv[1] == "true"
cfg = JobConfig(run_dir="unused", parallel=ParallelConfig(keep_freed_memory=keep),
                stages=[StageConfig(name="a")])
env = init_distributed(cfg)
print(json.dumps({"device": env.device.type, "applied": heap._applied}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
@pytest.mark.parametrize("keep", [True, False])
def test_init_distributed_applies_the_setting_on_cpu(keep):
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(keep).lower()],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    if got["device"] != "cpu":
        pytest.skip("a GPU is visible")
    assert got["applied"] is keep
