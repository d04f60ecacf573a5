"""Fixtures for krea2.dit tests."""

from __future__ import annotations

import pytest

from krea2.dit.config import DiTConfig, get_config


@pytest.fixture
def tiny_cfg() -> DiTConfig:
    return get_config("tiny")
