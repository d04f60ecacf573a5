"""The workspace's packages and their internal dependency graph, read from the pyprojects.

One source for the release script, the workflow generator and the release tests: a
package's workspace dependencies are the ``krea2-*`` distributions named in its
``[project] dependencies`` (extras included), never a hand-written list.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "krea2-"
# Upstream first: the order the graph in ARCHITECTURE.md is drawn in.
ORDER = ("infra", "krablet", "curate", "dit", "trainer", "rl", "expander")

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def dist_name(spec: str) -> str:
    """Normalized distribution name of a requirement: ``"krea2-dit[x]>=1"`` -> ``krea2-dit``."""
    match = _NAME.match(spec)
    if match is None:
        raise ValueError(f"not a requirement: {spec!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


@dataclass(frozen=True)
class Package:
    """One workspace member: ``packages/<name>`` with distribution ``krea2-<name>``."""

    name: str
    root: Path
    version: str
    dependencies: tuple[str, ...]  # requirement strings of [project] dependencies
    extras: dict[str, tuple[str, ...]]

    @property
    def dist(self) -> str:
        return PREFIX + self.name

    @property
    def pyproject(self) -> Path:
        return self.root / "pyproject.toml"

    @property
    def changelog(self) -> Path:
        return self.root / "CHANGELOG.md"

    @property
    def init(self) -> Path:
        return self.root / "src" / "krea2" / self.name / "__init__.py"

    def internal(self) -> set[str]:
        """Names of the workspace packages in ``dependencies`` (not the optional extras)."""
        names = {dist_name(spec) for spec in self.dependencies}
        return {n.removeprefix(PREFIX) for n in names if n.startswith(PREFIX)}

    def extra_internal(self) -> set[str]:
        """Workspace packages pulled in only by an optional extra."""
        names = {dist_name(spec) for specs in self.extras.values() for spec in specs}
        return {n.removeprefix(PREFIX) for n in names if n.startswith(PREFIX)} - {self.name}


def load(root: Path = ROOT) -> dict[str, Package]:
    """Every ``packages/*/pyproject.toml`` under ``root``, upstream first."""
    found: dict[str, Package] = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        dist = dist_name(project["name"])
        if not dist.startswith(PREFIX):
            raise ValueError(f"{pyproject}: distribution {dist!r} must start with {PREFIX!r}")
        name = dist.removeprefix(PREFIX)
        if pyproject.parent.name != name:
            raise ValueError(f"{pyproject}: directory must be named {name!r} after {dist!r}")
        found[name] = Package(
            name=name,
            root=pyproject.parent,
            version=project["version"],
            dependencies=tuple(project.get("dependencies", [])),
            extras={k: tuple(v) for k, v in project.get("optional-dependencies", {}).items()},
        )
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(found.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0])))


def upstream(packages: dict[str, Package], name: str, *, extras: bool = False) -> set[str]:
    """Every workspace package ``name`` depends on, directly or transitively."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        pkg = packages[stack.pop()]
        direct = pkg.internal() | (pkg.extra_internal() if extras else set())
        for dep in direct - seen:
            seen.add(dep)
            stack.append(dep)
    return seen


def dependents(packages: dict[str, Package], name: str) -> list[str]:
    """Workspace packages that declare ``name`` directly (in dependencies or an extra)."""
    return [
        other.name
        for other in packages.values()
        if name in other.internal() | other.extra_internal()
    ]


# Extras too heavy for a test environment (vLLM pulls CUDA builds); their code is tested
# where the extra is installed, and its absence is what scripts/isolation.py checks.
UNTESTED_EXTRAS = frozenset({"vllm"})


def test_extras(pkg: Package) -> list[str]:
    """The extras a package's own tests run with: all it declares but UNTESTED_EXTRAS."""
    return sorted(set(pkg.extras) - UNTESTED_EXTRAS)


if __name__ == "__main__":
    import sys

    # python3 scripts/workspace.py test-extras curate  ->  --extra embed --extra ocr
    if len(sys.argv) != 3 or sys.argv[1] != "test-extras":
        sys.exit("usage: python3 scripts/workspace.py test-extras <package>")
    print(" ".join(f"--extra {e}" for e in test_extras(load()[sys.argv[2]])))
