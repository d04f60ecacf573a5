"""Test environment for every package: offline hub, fixed seeds."""

from __future__ import annotations

import os
import random
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
