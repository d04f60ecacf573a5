"""scripts/typecheck.py: which signatures are public API, and mypy clean on them per package."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))

_spec = importlib.util.spec_from_file_location(
    "_krea2_typecheck", ROOT / "scripts" / "typecheck.py"
)
typecheck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(typecheck)

SOURCE = textwrap.dedent(
    """\
    import functools

    def exported(x):
        def nested(y):
            return y
        return nested(x)

    @functools.cache
    def decorated(x):
        return x

    def not_exported(x):
        return x

    class Exported:
        def __init__(self, a):
            self.a = a

        def method(self, b):
            return b

        def _private(self, c):
            return c

        def __exit__(self, *exc):
            return None

        class Inner:
            def deep(self, d):
                return d
    """
)


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(SOURCE.splitlines(), 1) if text in line)


def test_public_api_signatures_are_exported_functions_and_public_methods(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    api = [[str(path), q] for q in ("exported", "decorated", "Exported", "Exported.Inner")]
    lines = {line for _, line in typecheck.api_def_lines(api)}
    expected = ["def exported", "def decorated", "def __init__", "def method", "def deep"]
    assert lines == {line_of(t) for t in expected}
    for private in ("def nested", "def not_exported", "def _private", "def __exit__"):
        assert line_of(private) not in lines


def test_the_api_module_imports_every_public_module_and_export():
    info = {"all": ["__version__", "Warehouse", "pluck"], "modules": ["krea2.x.queue"]}
    text = typecheck.api_module("x", info)
    compile(text, "api.py", "exec")
    assert "import krea2.x\n" in text and "import krea2.x.queue\n" in text
    assert "    Warehouse as Warehouse,\n" in text and "__version__ as" not in text


def test_mypy_error_lines_parse():
    line = "/a/b/c.py:12: error: Function is missing a type annotation  [no-untyped-def]"
    match = typecheck.ERROR.match(line)
    assert (match["path"], match["line"], match["code"]) == ("/a/b/c.py", "12", "no-untyped-def")


@pytest.mark.slow
@pytest.mark.parametrize("name", PACKAGES)
def test_mypy_is_clean_on_the_public_api(name):
    mypy = str(Path(sys.executable).parent / "mypy")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck.py"), name, "--mypy", mypy],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 blocking errors" in proc.stdout
