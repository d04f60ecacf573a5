"""Fixtures for krea2.dit tests."""

from __future__ import annotations

import pytest

from krea2.dit.config import DiTConfig, get_config


@pytest.fixture
def tiny_cfg() -> DiTConfig:
    return get_config("tiny")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny-config ops run faster on one thread, and OpenMP does not spin on a shared CPU."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
