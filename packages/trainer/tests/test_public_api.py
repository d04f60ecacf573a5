"""The package root: every public name resolves, and importing the root loads no torch."""

from __future__ import annotations

import subprocess
import sys

import krea2.trainer


def test_every_public_name_resolves():
    for name in krea2.trainer.__all__:
        assert getattr(krea2.trainer, name) is not None, name


def test_importing_the_root_and_the_job_config_loads_no_torch():
    code = (
        "import sys, krea2.trainer; from krea2.trainer import JobConfig, load_job; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
