"""The package's shape: a cheap root exporting the public API, and SQL only in krablet.sql."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import krea2.krablet as kb

SRC = Path(kb.__file__).parent
SQL_TEXT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|WITH|ANALYZE)\b")


def test_every_public_name_resolves_from_the_root():
    for name in kb.__all__:
        assert getattr(kb, name).__name__ == name


def test_importing_the_root_loads_no_submodule():
    code = "import sys, krea2.krablet; print([m for m in sys.modules if 'krea2.krablet.' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_statements_are_built_only_in_the_sql_package():
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.parent.name == "sql":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            composes = (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "sql"
                and node.attr in ("SQL", "Identifier", "Literal")
            )
            text = (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and SQL_TEXT.match(node.value)
            )
            if composes or text:
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"SQL outside krea2.krablet.sql: {offenders}"
