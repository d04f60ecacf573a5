"""Type-check one package's public API with mypy, against an environment holding only its deps.

    uv sync --package krea2-dit --exact --no-editable
    python3 scripts/typecheck.py dit --python .venv/bin/python

The public API is what a user writes: ``from krea2.<name> import <each name in __all__>``
and ``import`` of every public module. mypy checks a module of exactly those imports
against the installed package (so a missing ``py.typed`` fails as ``import-untyped``) and
the package's own source with ``disallow_untyped_defs``. It fails on:

- any error in the API module (a name in ``__all__`` that does not exist, an unimportable
  public module, an untyped package);
- a public function or method without full annotations (``no-untyped-def``): one whose
  name, module and class do not start with ``_`` and that is not nested in a function.

Every other error mypy finds inside the package's implementation is counted and printed
but does not fail the check (``--strict-impl`` makes it fail): the implementation's
findings are a backlog, the public API must be clean. Standard library only; ``mypy`` is
taken from PATH (``--mypy`` to override).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from functools import cache
from pathlib import Path

ERROR = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<msg>.*?)(?:  \[(?P<code>[a-z-]+)\])?$"
)

# Runs in the target environment: the package's __all__ and public module names and location.
_INTROSPECT = r"""
import importlib, json, pkgutil, sys
name = sys.argv[1]
root = importlib.import_module(f"krea2.{name}")
mods = [m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"krea2.{name}.",
        onerror=lambda n: None) if not any(p.startswith("_") for p in m.name.split("."))]
print(json.dumps({"all": list(getattr(root, "__all__", [])), "modules": mods,
                  "dir": list(root.__path__)[0]}))
"""


def introspect(python: str, name: str) -> dict:
    proc = subprocess.run(
        [python, "-c", _INTROSPECT, name], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"cannot import krea2.{name} with {python}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def api_module(name: str, info: dict) -> str:
    """A module that imports exactly the public API, as a user would."""
    lines = [f'"""The public API of krea2.{name}, imported as a user imports it."""', ""]
    lines += [f"import {module}" for module in [f"krea2.{name}", *info["modules"]]]
    exported = [n for n in info["all"] if n != "__version__"]
    if exported:
        lines.append(f"from krea2.{name} import (")
        lines += [f"    {n} as {n}," for n in exported]
        lines.append(")")
    return "\n".join(lines) + "\n"


@cache
def _defs(path: str) -> dict[int, bool]:
    """Line of each ``def`` in ``path`` -> whether it is public API (see the module doc)."""
    public: dict[int, bool] = {}
    tree = ast.parse(Path(path).read_text())

    def visit(node: ast.AST, visible: bool, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                dunder = child.name.startswith("__") and child.name.endswith("__")
                ok = visible and not in_function and (dunder or not child.name.startswith("_"))
                for line in range(child.lineno, (child.body[0].lineno if child.body else 0) + 1):
                    public.setdefault(line, ok)
                visit(child, False, True)
            elif isinstance(child, ast.ClassDef):
                visit(
                    child,
                    visible and not in_function and not child.name.startswith("_"),
                    in_function,
                )
            else:
                visit(child, visible, in_function)

    visit(tree, True, False)
    return public


def is_public_def(path: str, line: int, package_dir: str) -> bool:
    rel = Path(path).resolve().relative_to(Path(package_dir).resolve())
    if any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
        return False
    return _defs(str(Path(path).resolve())).get(line, False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="e.g. dit")
    parser.add_argument("--python", default=sys.executable, help="the environment to check in")
    parser.add_argument("--mypy", default="mypy", help="mypy command (default: mypy on PATH)")
    parser.add_argument("--strict-impl", action="store_true", help="fail on every mypy error")
    args = parser.parse_args(argv)
    info = introspect(args.python, args.package)
    with tempfile.TemporaryDirectory(prefix="krea2-typecheck-") as tmp:
        api = Path(tmp) / f"krea2_{args.package}_api.py"
        api.write_text(api_module(args.package, info))
        common = [
            *shlex.split(args.mypy),
            "--python-executable", args.python,
            "--ignore-missing-imports",
            "--disallow-untyped-defs",
            "--disallow-incomplete-defs",
            "--no-error-summary",
            "--show-error-codes",
            "--no-pretty",
            "--cache-dir", str(Path(tmp) / "cache"),
        ]  # fmt: skip
        # Two runs sharing one cache: mypy takes files or a package, not both.
        output = ""
        for target in ([str(api)], ["-p", f"krea2.{args.package}"]):
            proc = subprocess.run(
                [*common, *target], capture_output=True, text=True, check=False, cwd=tmp
            )
            if proc.returncode not in (0, 1):
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return proc.returncode
            output += proc.stdout
        blocking, backlog = [], Counter()
        for line in sorted(set(output.splitlines())):
            match = ERROR.match(line)
            if match is None:
                continue
            path, code = match["path"], match["code"] or "misc"
            if Path(path).name == api.name:
                blocking.append(line.replace(str(api), api.name))
            elif code in ("no-untyped-def",) and is_public_def(
                path, int(match["line"]), info["dir"]
            ):
                blocking.append(line)
            else:
                backlog[code] += 1
                if args.strict_impl:
                    blocking.append(line)
    for line in blocking:
        print(line)
    summary = ", ".join(f"{code} {n}" for code, n in backlog.most_common()) or "none"
    print(
        f"krea2.{args.package}: public API {len(info['all'])} names, {len(info['modules']) + 1} "
        f"modules: {len(blocking)} blocking errors; implementation backlog "
        f"{sum(backlog.values())} ({summary})"
    )
    return 1 if blocking else 0


if __name__ == "__main__":
    sys.exit(main())
