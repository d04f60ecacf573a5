"""The tree's shape: no import cycle inside a package, the umbrella uses only public names,
package roots give type checkers the real types of their lazy exports, and no module grows
past ~400 lines without saying why at its top.

Imports are read statically (``ast``), function-level (lazy) imports included: a lazy
import still ties two modules into one concept. Edges: ``import krea2.a.b`` and
``from krea2.a.b import f`` point at ``krea2.a.b``; ``from krea2.a import b`` points at the
submodule ``krea2.a.b`` when there is one, else at ``krea2.a`` (its ``__init__``). A package
root's ``if TYPE_CHECKING:`` block is not an edge: it spells the root's lazy-export table
(already its public API, not a dependency) in types, and never runs.
"""

from __future__ import annotations

import ast
import importlib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("infra", "krablet", "curate", "dit", "trainer", "rl", "expander")
UMBRELLA = ROOT / "src"
MAX_LINES = 400
LONG_MARK = "long module:"  # e.g. '# long module: the released checkpoint's 60 key rules'


def source_root(package: str) -> Path:
    return ROOT / "packages" / package / "src"


@cache
def modules(src: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module under a ``src`` directory."""
    found = {}
    for path in src.rglob("*.py"):
        name = ".".join(path.relative_to(src).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def type_checking_blocks(tree: ast.Module) -> list[ast.If]:
    """The module-level ``if TYPE_CHECKING:`` blocks of ``tree``."""
    return [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]


def imports_of(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names ([] for ``import m``), line) for every absolute import, but
    those of a package root's ``if TYPE_CHECKING:`` block (see the module docstring)."""
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    if path.name == "__init__.py":
        for block in type_checking_blocks(tree):
            tree.body.remove(block)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [alias.name for alias in node.names], node.lineno))
    return found


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module → the modules of the same tree it imports."""
    known = modules(src)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for module, names, _ in imports_of(path):
            targets = [f"{module}.{n}" if f"{module}.{n}" in known else module for n in names]
            graph[name] |= {t for t in targets or [module] if t in known and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_cycle_finder_finds_a_lazy_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "krea2" / "demo_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from krea2.demo_pkg.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from krea2.demo_pkg import a\n")
    (pkg / "c.py").write_text("import krea2.demo_pkg.a\n")
    cycle = find_cycle(import_graph(tmp_path))
    assert cycle == ["krea2.demo_pkg.a", "krea2.demo_pkg.b", "krea2.demo_pkg.a"]
    (pkg / "b.py").write_text("def g():\n    pass\n")
    modules.cache_clear()
    assert find_cycle(import_graph(tmp_path)) is None


@pytest.mark.parametrize("package", [*PACKAGES, "umbrella"])
def test_no_import_cycle_inside_a_package(package: str) -> None:
    src = UMBRELLA if package == "umbrella" else source_root(package)
    cycle = find_cycle(import_graph(src))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@cache
def declared_all(package: str, module: str) -> frozenset[str] | None:
    """The ``__all__`` of ``module`` (a module of ``package``), or None if it has none.

    Read by importing the module: package roots build ``__all__`` from their lazy tables.
    """
    if module not in modules(source_root(package)):
        return None
    exported = getattr(importlib.import_module(module), "__all__", None)
    return None if exported is None else frozenset(exported)


def public_violation(module: str, names: list[str]) -> str | None:
    """Why importing ``names`` from ``module`` reaches past a package's public API, or None.

    Public: ``krea2.<pkg>`` and the names in its ``__all__``; a public name that is a
    subpackage (``krea2.curate.shapes``) is public in turn, with its own ``__all__``.
    """
    parts = module.split(".")
    package = parts[1]
    current = f"krea2.{package}"
    for part in parts[2:]:
        exported = declared_all(package, current)
        if exported is None or part not in exported:
            return f"{current}.{part} is not in {current}.__all__"
        current = f"{current}.{part}"
    exported = declared_all(package, current)
    if exported is None:
        return f"{current} declares no __all__"
    hidden = [n for n in names if n not in exported]
    return f"{hidden} not in {current}.__all__" if hidden else None


def test_public_violation_reads_all_through_subpackages() -> None:
    assert declared_all("krablet", "krea2.krablet") is not None
    assert public_violation("krea2.krablet", ["Warehouse"]) is None
    assert "not in krea2.krablet.__all__" in (public_violation("krea2.krablet", ["_x"]) or "")
    assert public_violation("krea2.krablet.no_such_module", ["x"]) is not None


def test_umbrella_imports_only_public_names() -> None:
    problems = []
    for path in modules(UMBRELLA).values():
        for module, names, line in imports_of(path):
            if not module.startswith("krea2.") or module.split(".")[1] not in PACKAGES:
                continue
            why = public_violation(module, names)
            if why:
                problems.append(f"{path.relative_to(ROOT)}:{line}: from {module}: {why}")
    assert not problems, "\n".join(problems)


def test_every_package_declares_its_public_api() -> None:
    missing = [p for p in PACKAGES if declared_all(p, f"krea2.{p}") is None]
    assert not missing, f"krea2.<package>/__init__.py without __all__: {missing}"


def lazy_roots() -> list[tuple[str, Path]]:
    """(package name, ``__init__.py``) of every package root built on ``lazy_exports``."""
    return [
        (name, path)
        for src in (source_root(p) for p in PACKAGES)
        for name, path in modules(src).items()
        if path.name == "__init__.py" and "lazy_exports(" in path.read_text()
    ]


def test_lazy_roots_give_type_checkers_every_export() -> None:
    """``from krea2.trainer import Job`` has a real type for mypy/pyright and IDEs: each
    root's TYPE_CHECKING block imports exactly the names its lazy table exports, each from
    the module the table names."""
    problems = []
    for name, path in lazy_roots():
        homes = lazy_table(name)
        typed: dict[str, str] = {}
        for block in type_checking_blocks(ast.parse(path.read_text())):
            for node in ast.walk(block):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        home = node.module.removeprefix(name).lstrip(".") or alias.name
                        if alias.asname not in (None, alias.name):
                            home += f" as {alias.asname}"  # renamed: not the table's name
                        typed[alias.asname or alias.name] = home
        expected = {n: (n if h is None else h) for n, h in homes.items()}
        if typed != expected:
            wrong = sorted(set(typed.items()) ^ set(expected.items()))
            problems.append(f"{path.relative_to(ROOT)}: TYPE_CHECKING block differs: {wrong}")
    assert lazy_roots() and not problems, "\n".join(problems)


def lazy_table(package: str) -> dict[str, str | None]:
    """The ``homes`` table behind a root's lazy ``__getattr__`` (name → submodule)."""
    getter = importlib.import_module(package).__getattr__
    cells = dict(zip(getter.__code__.co_freevars, getter.__closure__ or (), strict=True))
    return dict(cells["homes"].cell_contents)


def test_no_long_module_without_a_reason_at_its_top() -> None:
    sources = [UMBRELLA, *(source_root(p) for p in PACKAGES)]
    long = []
    for src in sources:
        for path in modules(src).values():
            lines = path.read_text().splitlines()
            if len(lines) > MAX_LINES and not any(LONG_MARK in ln for ln in lines[:30]):
                long.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert not long, (
        f"modules over {MAX_LINES} lines: split them by concept, or say why at the top "
        f"('{LONG_MARK} <reason>'): {long}"
    )
