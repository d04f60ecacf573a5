"""Test environment for every package: offline hub, fixed seeds."""

from __future__ import annotations

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEST_SEED = 1234


def pytest_runtest_setup(item) -> None:
    """Every test starts from the same Python, NumPy and (if loaded) torch seeds."""
    import sys

    random.seed(TEST_SEED)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(TEST_SEED)
    if "torch" in sys.modules:  # never import torch here: krablet/curate tests stay torch-free
        sys.modules["torch"].manual_seed(TEST_SEED)
