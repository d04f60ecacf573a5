"""The GitHub Actions workflows: one CI and one publish workflow per package, actionlint-clean.

A package's dependencies are read here from the pyprojects (not from the generator), so a
dependency added to a pyproject without regenerating the workflows fails these tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
PACKAGES = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))


def workspace_deps(name: str) -> set[str]:
    """Workspace packages ``name`` depends on, transitively, from the pyprojects' dependencies."""
    found: set[str] = set()
    stack = [name]
    while stack:
        project = tomllib.loads((ROOT / "packages" / stack.pop() / "pyproject.toml").read_text())
        for spec in project["project"].get("dependencies", []):
            dist = re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0].lower().replace("_", "-")
            dep = dist.removeprefix("krea2-")
            if dist.startswith("krea2-") and dep not in found:
                found.add(dep)
                stack.append(dep)
    return found


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def glob_matches(pattern: str, path: str) -> bool:
    """GitHub's path-filter glob: ``**`` crosses directories, ``*`` does not."""
    regex = re.escape(pattern).replace(r"\*\*", "\0").replace(r"\*", "[^/]*").replace("\0", ".*")
    return re.fullmatch(regex, path) is not None


def uncovered(workflow: dict, name: str) -> list[str]:
    """Files that should trigger ``name``'s CI but that a path filter of ``workflow`` misses."""
    must = [
        f"packages/{d}/src/krea2/{d}/__init__.py" for d in sorted({name} | workspace_deps(name))
    ]
    must += [f"packages/{name}/tests/test_x.py", f"packages/{name}/pyproject.toml", "uv.lock"]
    missing = []
    for event in ("push", "pull_request"):
        paths = (workflow["on"].get(event) or {}).get("paths")
        if paths is None:
            continue  # no filter: every change runs it
        missing += [f"{event}: {f}" for f in must if not any(glob_matches(p, f) for p in paths)]
    return missing


def run_steps(workflow: dict, job: str) -> str:
    return "\n".join(step.get("run", "") for step in workflow["jobs"][job]["steps"])


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_has_a_ci_and_a_publish_workflow(name):
    for kind in ("ci", "publish"):
        assert (WORKFLOWS / f"{kind}-{name}.yml").is_file(), (
            f"packages/{name} has no .github/workflows/{kind}-{name}.yml: "
            "run python3 scripts/gen_workflows.py"
        )


@pytest.mark.parametrize("name", PACKAGES)
def test_ci_path_filter_covers_the_package_and_every_workspace_dependency(name):
    workflow = load(WORKFLOWS / f"ci-{name}.yml")
    assert {"push", "pull_request"} <= set(workflow["on"])
    assert uncovered(workflow, name) == []


def test_a_path_filter_missing_a_dependency_is_caught():
    workflow = load(WORKFLOWS / "ci-rl.yml")
    for event in ("push", "pull_request"):
        paths = workflow["on"][event]["paths"]
        workflow["on"][event]["paths"] = [p for p in paths if p != "packages/krablet/**"]
    assert "krablet" in workspace_deps("rl")
    assert uncovered(workflow, "rl") == [
        "push: packages/krablet/src/krea2/krablet/__init__.py",
        "pull_request: packages/krablet/src/krea2/krablet/__init__.py",
    ]


@pytest.mark.parametrize("name", PACKAGES)
def test_ci_lints_typechecks_tests_alone_builds_and_checks_the_wheel(name):
    workflow = load(WORKFLOWS / f"ci-{name}.yml")
    assert re.search(rf"ruff(@[\d.]+)? check packages/{name}\n", run_steps(workflow, "lint"))
    assert f"uv sync --package krea2-{name} --exact" in run_steps(workflow, "typecheck")
    assert f"scripts/typecheck.py {name}" in run_steps(workflow, "typecheck")
    alone = rf"uv run --package krea2-{name} --exact( --extra \w+)* pytest packages/{name}/tests"
    assert re.search(alone, run_steps(workflow, "test"))
    assert "--extra vllm" not in run_steps(workflow, "test")
    build = run_steps(workflow, "build")
    for command in (f"uv build --package krea2-{name}", "twine", "check --strict",
                    "scripts/check_wheel.py", f"scripts/isolation.py {name}"):  # fmt: skip
        assert command in build


@pytest.mark.parametrize("name", PACKAGES)
def test_publishing_is_tag_triggered_and_uses_trusted_publishing(name):
    text = (WORKFLOWS / f"publish-{name}.yml").read_text()
    workflow = load(WORKFLOWS / f"publish-{name}.yml")
    assert workflow["on"] == {"push": {"tags": [f"krea2-{name}-v*"]}}
    publish = workflow["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert any(
        s.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for s in publish["steps"]
    )
    assert "secrets." not in text and "password" not in text  # OIDC, no API token
    assert "scripts/release.py check-tag" in run_steps(workflow, "build")


def test_integration_runs_the_readme_test_command_and_the_quick_demo():
    steps = run_steps(load(WORKFLOWS / "integration.yml"), "integration")
    command = "uv run pytest -n 3 --dist loadscope"  # the README's, as .ci/run runs it
    assert command in steps and "krea2 demo --quick" in steps
    assert command in (ROOT / "README.md").read_text()
    assert "pytest -n 3 --dist loadscope" in (ROOT / ".ci" / "run").read_text()


def test_workflows_are_what_the_generator_writes():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_workflows.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def actionlint() -> str:
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which(
        "actionlint"
    )
    assert found, "actionlint is missing: it comes with the dev group (uv sync)"
    return found


def test_actionlint_passes_on_every_workflow():
    files = sorted(str(p) for p in WORKFLOWS.glob("*.y*ml"))
    assert len(files) == 2 * len(PACKAGES) + 1
    proc = subprocess.run([actionlint(), *files], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ matrix.nope }}\n"
    )
    proc = subprocess.run([actionlint(), str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "matrix" in proc.stdout
