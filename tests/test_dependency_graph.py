"""The one-way package graph of ARCHITECTURE.md, checked against every source file's imports.

Two rules: a package may import only krea2 packages upstream of it in the graph, and
every distribution it imports (krea2 or third-party) must be declared in its own
pyproject (dependencies or an optional extra), so it installs and runs alone.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Direct edges of ARCHITECTURE.md: infra -> krablet -> curate; infra -> dit -> trainer;
# curate, trainer -> rl -> expander.
EDGES: dict[str, set[str]] = {
    "infra": set(),
    "krablet": {"infra"},
    "curate": {"krablet"},
    "dit": {"infra"},
    "trainer": {"dit"},
    "rl": {"curate", "trainer"},
    "expander": {"rl"},
}
PACKAGES = tuple(EDGES)


def upstream(name: str) -> set[str]:
    """Every package reachable from ``name`` along the edges (what it may import)."""
    seen: set[str] = set()
    stack = list(EDGES[name])
    while stack:
        dep = stack.pop()
        if dep not in seen:
            seen.add(dep)
            stack.extend(EDGES[dep])
    return seen


def normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def declared(pyproject: Path) -> set[str]:
    """Distribution names in [project] dependencies and optional-dependencies."""
    project = tomllib.loads(pyproject.read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    return {normalize(re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0]) for spec in specs}


def imported_modules(source_dir: Path) -> dict[str, set[str]]:
    """Top-level module names imported anywhere under ``source_dir`` (with the files)."""
    found: dict[str, set[str]] = {}
    for path in source_dir.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                if node.module == "krea2":
                    names = [f"krea2.{alias.name}" for alias in node.names]
            for name in names:
                top = (
                    ".".join(name.split(".")[:2])
                    if name.startswith("krea2.")
                    else name.split(".")[0]
                )
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@cache
def module_distributions() -> dict[str, list[str]]:
    return {k: [normalize(d) for d in v] for k, v in metadata.packages_distributions().items()}


def check_imports(
    owner: str, source_dir: Path, allowed_internal: set[str], deps: set[str]
) -> list[str]:
    problems = []
    for module, files in sorted(imported_modules(source_dir).items()):
        where = sorted(files)[0]
        if module.startswith("krea2."):
            target = module.split(".")[1]
            if target == owner or (owner == "krea2" and target == "pipeline"):
                continue
            if target not in allowed_internal:
                problems.append(
                    f"{where}: {owner} imports krea2.{target}, an edge not in the graph"
                )
            elif f"krea2-{target}" not in deps:
                problems.append(
                    f"{where}: imports krea2.{target} but krea2-{target} is not declared"
                )
            continue
        if module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = module_distributions().get(module)
        if not dists:
            problems.append(
                f"{where}: imports {module!r}, which no installed distribution provides"
            )
        elif not set(dists) & deps:
            problems.append(
                f"{where}: imports {module!r} (from {dists[0]}) but does not declare it"
            )
    return problems


@pytest.mark.parametrize("name", PACKAGES)
def test_package_imports_follow_the_graph_and_its_declared_dependencies(name):
    package = ROOT / "packages" / name
    problems = check_imports(
        name, package / "src" / "krea2", upstream(name), declared(package / "pyproject.toml")
    )
    assert not problems, "\n".join(problems)


def test_umbrella_declares_all_seven_packages():
    deps = declared(ROOT / "pyproject.toml")
    assert {f"krea2-{name}" for name in PACKAGES} <= deps
    problems = check_imports("krea2", ROOT / "src" / "krea2", set(PACKAGES), deps)
    assert not problems, "\n".join(problems)


def test_pyproject_internal_dependencies_are_upstream_only():
    for name in PACKAGES:
        deps = declared(ROOT / "packages" / name / "pyproject.toml")
        internal = {d.removeprefix("krea2-") for d in deps if d.startswith("krea2-")}
        assert internal <= upstream(name), f"krea2-{name} declares {internal - upstream(name)}"


def test_graph_is_acyclic_and_namespace_has_no_init():
    for name in PACKAGES:
        assert name not in upstream(name)
    inits = list(ROOT.glob("packages/*/src/krea2/__init__.py")) + list(
        ROOT.glob("src/krea2/__init__.py")
    )
    assert not inits, f"krea2 must stay a namespace package: remove {inits}"


def test_checker_catches_an_upward_import(tmp_path):
    src = tmp_path / "krea2" / "krablet"
    src.mkdir(parents=True)
    (src / "bad.py").write_text("import torch\nfrom krea2.dit import model\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        problems = check_imports(
            "krablet", tmp_path / "krea2", upstream("krablet"), {"krea2-infra"}
        )
    finally:
        ROOT = saved
    assert any("krea2.dit, an edge not in the graph" in p for p in problems)
    assert any("'torch'" in p and "does not declare" in p for p in problems)
