"""Cross-package tests: their helpers (not shipped in any wheel) import from this folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # browser_screenshot, under importlib mode


@pytest.fixture(scope="session")
def plain_demo(tmp_path_factory, worker_id):
    """(out, record) of the plain quick demo through export-64 (``demo_runs``): one run per
    session, shared by the xdist workers through their common temp folder."""
    from demo_runs import plain_run_to_export

    root = tmp_path_factory.getbasetemp()
    return plain_run_to_export(root if worker_id == "master" else root.parent)
