"""Test environment for every package: offline hub, fixed seeds."""

from __future__ import annotations

import os
import random
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs 3 xdist workers on 2 cores, and each starts torch processes with 2 OpenMP
# threads: libgomp's idle threads spin before they sleep, billing CPU the other processes
# need. Waiting passively took 9 % off the CPU time and 5-7 % off the wall time of the
# trainer and rl job tests under -n 3 (2026-12-06, twice, either order). It changes how
# threads wait, not what they compute. Set before any test imports torch; children inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A shell starts background jobs (`pytest ... &` in a script, nohup) with SIGINT ignored,
# and an ignored signal stays ignored across exec: every CLI the tests start would then
# shrug off the Ctrl-C the interruption tests send. A handled signal is reset to the
# default on exec, so restoring Python's handler here gives children a normal Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TEST_SEED = 1234


def pytest_runtest_setup(item) -> None:
    """Every test starts from the same Python, NumPy and (if loaded) torch seeds."""
    import sys

    random.seed(TEST_SEED)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(TEST_SEED)
    if "torch" in sys.modules:  # never import torch here: krablet/curate tests stay torch-free
        sys.modules["torch"].manual_seed(TEST_SEED)
