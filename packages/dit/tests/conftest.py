"""Fixtures for krea2.dit tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from krea2.dit.config import DiTConfig, get_config

sys.path.insert(0, str(Path(__file__).parent))  # dit_test_helpers, under importlib mode


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


@pytest.fixture(scope="session")
def serving_folder(tmp_path_factory):
    """A tiny model folder in the release layout (random weights) for the image server."""
    from krea2.dit.testing import write_tiny_model_folder

    return write_tiny_model_folder(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="session")
def styled_folder(serving_folder, tmp_path_factory):
    """The same folder with a random style module (style.safetensors): style references on."""
    import shutil

    from krea2.dit.release import read_dit_config
    from krea2.dit.style_module import StyleConfig, StyleModule, save_style_module
    from krea2.dit.testing import randomize

    root = tmp_path_factory.mktemp("serve-style") / "tiny-style"
    shutil.copytree(serving_folder, root)
    module = StyleModule(StyleConfig.for_dit(read_dit_config(root), max_refs=2))
    randomize(module, seed=1, std=0.1)
    save_style_module(module, root / "style.safetensors")
    return root
