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


def test_lazy_exports_import_a_name_on_first_use_and_cache_it(tmp_path, monkeypatch):
    pkg = tmp_path / "lazy_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from krea2.infra.lazy import lazy_exports\n"
        "__getattr__, __dir__ = lazy_exports(__name__, {'VALUE': 'heavy', 'heavy': None})\n"
    )
    (pkg / "heavy.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_pkg", raising=False)
    monkeypatch.delitem(sys.modules, "lazy_pkg.heavy", raising=False)
    lazy_pkg = importlib.import_module("lazy_pkg")
    assert "lazy_pkg.heavy" not in sys.modules
    assert lazy_pkg.VALUE == 42 and "VALUE" in vars(lazy_pkg)  # cached in the namespace
    assert lazy_pkg.heavy is sys.modules["lazy_pkg.heavy"]
    assert dir(lazy_pkg) == ["VALUE", "heavy"]
    with pytest.raises(AttributeError, match="'lazy_pkg' has no attribute 'missing'"):
        lazy_pkg.missing  # noqa: B018
