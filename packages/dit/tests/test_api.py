"""The package root: a cheap import, and every public name resolves."""

from __future__ import annotations

import subprocess
import sys

import krea2.dit


def test_importing_the_root_imports_no_torch():
    code = "import sys, krea2.dit; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_every_public_name_resolves():
    for name in krea2.dit.__all__:
        assert getattr(krea2.dit, name) is not None, name
    from krea2.dit import generate, patchify

    assert callable(generate) and callable(patchify)  # functions, not their modules
