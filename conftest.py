"""Test environment for every package: offline hub, fixed seeds."""

from __future__ import annotations

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEST_SEED = 1234


def pytest_runtest_setup(item) -> None:  # noqa: ARG001 - pytest hook signature
    random.seed(TEST_SEED)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(TEST_SEED)
