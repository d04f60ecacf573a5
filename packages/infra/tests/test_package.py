"""The package root: a complete, lazily resolved ``__all__`` and a cheap import."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

import krea2.infra


def test_root_import_loads_neither_torch_nor_pyarrow():
    code = (
        "import sys, krea2.infra; "
        "heavy = [m for m in ('torch', 'pyarrow', 'numpy', 'prometheus_client') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", krea2.infra.__all__)
def test_every_public_name_resolves_to_its_definition(name):
    value = getattr(krea2.infra, name)
    if isinstance(value, types.ModuleType):
        assert value is importlib.import_module(f"krea2.infra.{name}")
    else:
        home = importlib.import_module(f"krea2.infra.{krea2.infra._NAME_TO_MODULE[name]}")
        assert value is getattr(home, name)


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        krea2.infra.no_such_name  # noqa: B018
