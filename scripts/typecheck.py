"""Type-check one package's public API with mypy, against an environment holding only its deps.

    uv sync --package krea2-dit --exact --no-editable
    python3 scripts/typecheck.py dit --python .venv/bin/python

The public API is what a user writes: ``from krea2.<name> import <each name in __all__>``
and ``import`` of every public module. mypy checks a module of exactly those imports
against the installed package (so a missing ``py.typed`` fails as ``import-untyped``) and
the package's own source with ``disallow_untyped_defs``. It fails on:

- any error in the API module (a name in ``__all__`` that does not exist, an unimportable
  public module, an untyped package);
- a function the package root exports, or a public method of a class it exports, with no
  annotation at all (``no-untyped-def``); a missing return or parameter annotation on one
  is listed as a gap (``--strict-api`` makes gaps fail too). The public API is the root's
  ``__all__`` (the project's rule: packages use each other only through ``krea2.<pkg>``
  top-level exports); dunders count, except ``__exit__``/``__aexit__``, whose arguments
  only ``with`` passes.

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
from pathlib import Path

ERROR = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<msg>.*?)(?:  \[(?P<code>[a-z-]+)\])?$"
)

# mypy's message for a def with no annotation at all (partial ones say more after it).
UNTYPED = "Function is missing a type annotation"
# Dunders whose parameters the language fixes and no user passes: not API surface.
PROTOCOL_ONLY = {"__exit__", "__aexit__"}

# Runs in the target environment: the package's __all__ and public module names and location.
_INTROSPECT = r"""
import importlib, inspect, json, pkgutil, sys
name = sys.argv[1]
root = importlib.import_module(f"krea2.{name}")
mods = [m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"krea2.{name}.",
        onerror=lambda n: None) if not any(p.startswith("_") for p in m.name.split("."))]
api = []  # [source file, qualified name] of every exported function and class
queue, seen = [(root, n) for n in getattr(root, "__all__", [])], set()
while queue:
    owner, export = queue.pop()
    try:
        obj = inspect.unwrap(getattr(owner, export))
    except (ImportError, AttributeError):  # an extra this environment lacks: mypy reads it
        continue
    if inspect.ismodule(obj):  # an exported subpackage: its own __all__ is API too
        if obj.__name__.startswith(f"krea2.{name}") and obj.__name__ not in seen:
            seen.add(obj.__name__)
            queue += [(obj, n) for n in getattr(obj, "__all__", [])]
        continue
    obj = getattr(obj, "py_func", obj)  # numba dispatchers wrap the Python function
    if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(
        obj, "__module__", ""
    ).startswith(f"krea2.{name}"):
        try:
            api.append([inspect.getsourcefile(obj), obj.__qualname__])
        except TypeError:
            pass
print(json.dumps({"all": list(getattr(root, "__all__", [])), "modules": mods,
                  "dir": list(root.__path__)[0], "api": api}))
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


def api_def_lines(api: list[list[str]]) -> set[tuple[str, int]]:
    """(file, line of ``def``) of every exported function and every public method of an
    exported class: the signatures a user of ``krea2.<name>`` calls."""
    lines: set[tuple[str, int]] = set()
    trees: dict[str, ast.Module] = {}
    for path, qualname in api:
        path = str(Path(path).resolve())
        if path not in trees:
            trees[path] = ast.parse(Path(path).read_text())
        scope: list[ast.stmt] = trees[path].body
        node: ast.stmt | None = None
        for part in qualname.split("."):
            node = next((n for n in scope if getattr(n, "name", None) == part), None)
            if node is None:
                break
            scope = getattr(node, "body", [])
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines.add((path, node.lineno))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and is_api_name(
                    item.name
                ):
                    lines.add((path, item.lineno))
    return lines


def is_api_name(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return (dunder and name not in PROTOCOL_ONLY) or not name.startswith("_")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="e.g. dit")
    parser.add_argument("--python", default=sys.executable, help="the environment to check in")
    parser.add_argument("--mypy", default="mypy", help="mypy command (default: mypy on PATH)")
    parser.add_argument(
        "--strict-api", action="store_true", help="fail on partly annotated exported signatures"
    )
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
        api_lines = api_def_lines(info["api"])
        blocking, gaps, backlog = [], [], Counter()
        for line in sorted(set(output.splitlines())):
            match = ERROR.match(line)
            if match is None:
                continue
            path, code = match["path"], match["code"] or "misc"
            exported = (str(Path(path).resolve()), int(match["line"])) in api_lines
            if Path(path).name == api.name:
                blocking.append(line.replace(str(api), api.name))
            elif code == "no-untyped-def" and exported and match["msg"] == UNTYPED:
                blocking.append(line)
            elif code == "no-untyped-def" and exported:
                (blocking if args.strict_api else gaps).append(line)
            else:
                backlog[code] += 1
                if args.strict_impl:
                    blocking.append(line)
    for line in blocking:
        print(line)
    for line in gaps:
        print(f"gap (not blocking): {line}")
    summary = ", ".join(f"{code} {n}" for code, n in backlog.most_common()) or "none"
    print(
        f"krea2.{args.package}: public API {len(info['all'])} names, {len(info['modules']) + 1} "
        f"modules, {len(api_lines)} exported signatures: {len(blocking)} blocking errors, "
        f"{len(gaps)} partly annotated exported signatures; implementation backlog "
        f"{sum(backlog.values())} ({summary})"
    )
    return 1 if blocking else 0


if __name__ == "__main__":
    sys.exit(main())
