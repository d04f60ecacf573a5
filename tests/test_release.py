"""scripts/release.py on a copy of the workspace: versions, dependents' bounds, changelogs.

Every test works on a tmp copy of the pyprojects, changelogs and package roots, so the
real tree is never written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "release.py"
PACKAGES = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))


def copy_workspace(dest: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    for name in PACKAGES:
        src, dst = ROOT / "packages" / name, dest / "packages" / name
        (dst / "src" / "krea2" / name).mkdir(parents=True)
        for rel in ("pyproject.toml", "CHANGELOG.md", f"src/krea2/{name}/__init__.py"):
            shutil.copy(src / rel, dst / rel)
    return dest


@pytest.fixture
def ws(tmp_path) -> Path:
    return copy_workspace(tmp_path)


def release(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(ws), *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def add_entry(ws: Path, name: str, line: str = "- A change users notice.") -> None:
    path = ws / "packages" / name / "CHANGELOG.md"
    text = re.sub(
        r"^## \[Unreleased\]$", f"## [Unreleased]\n\n{line}", path.read_text(), flags=re.M
    )
    path.write_text(text)


def clear_entries(ws: Path, name: str) -> None:
    """Empty the ``[Unreleased]`` section of ``name``'s changelog (the copy's, whatever the
    live one holds)."""
    path = ws / "packages" / name / "CHANGELOG.md"
    text = re.sub(r"(^## \[Unreleased\]\n)(?:.*?\n)*?(?=^## )", r"\1\n", path.read_text(),
                  flags=re.M)  # fmt: skip
    path.write_text(text)


def snapshot(ws: Path) -> dict[str, str]:
    return {str(p.relative_to(ws)): p.read_text() for p in sorted(ws.rglob("*")) if p.is_file()}


def version(ws: Path, name: str) -> str:
    return tomllib.loads((ws / "packages" / name / "pyproject.toml").read_text())["project"][
        "version"
    ]


def requirement(ws: Path, target: str, dist: str) -> list[str]:
    path = (
        ws / "pyproject.toml" if target == "root" else ws / "packages" / target / "pyproject.toml"
    )
    project = tomllib.loads(path.read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    return [s for s in specs if re.match(rf"{dist}(\[|>|=|<|!|~|$)", s)]


def test_dry_run_shows_the_bump_and_the_dependents_bounds_and_writes_nothing(ws):
    add_entry(ws, "dit")
    before = snapshot(ws)
    proc = release(ws, "bump", "dit", "minor", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(ws) == before
    out = proc.stdout
    assert '+version = "0.2.0"' in out and '+__version__ = "0.2.0"' in out
    assert "+## [0.2.0] - " in out
    # every package that declares krea2-dit (the expander does: its toy tokenizer is dit's)
    for dependent in ("trainer", "rl", "expander"):
        assert f"b/packages/{dependent}/pyproject.toml" in out
        assert f"b/packages/{dependent}/CHANGELOG.md" in out
    assert '"krea2-dit>=0.2.0"' in out and "b/pyproject.toml" in out
    for other in ("infra", "krablet", "curate"):  # not dependents
        assert f"packages/{other}/" not in out
    assert "dry run: krea2-dit 0.2.0" in out


def test_release_writes_the_version_the_bounds_and_dates_the_changelog(ws):
    add_entry(ws, "infra", "- Checkpoints record their rank count.")
    proc = release(ws, "bump", "infra", "0.3.0")
    assert proc.returncode == 0, proc.stderr
    assert "git tag krea2-infra-v0.3.0" in proc.stdout
    assert version(ws, "infra") == "0.3.0"
    init = (ws / "packages/infra/src/krea2/infra/__init__.py").read_text()
    assert '__version__ = "0.3.0"' in init
    changelog = (ws / "packages/infra/CHANGELOG.md").read_text()
    unreleased, dated = changelog.split("## [0.3.0] - ")
    assert "- Checkpoints record their rank count." in dated.split("## [0.1.0]")[0]
    assert unreleased.rstrip().endswith("## [Unreleased]")
    # every package that declares krea2-infra, with its extras kept, and the umbrella project
    assert requirement(ws, "trainer", "krea2-infra") == ["krea2-infra[torch,tracking]>=0.3.0"]
    assert requirement(ws, "krablet", "krea2-infra") == ["krea2-infra>=0.3.0"]
    assert requirement(ws, "root", "krea2-infra") == ["krea2-infra[torch,tracking,gpu,k8s]>=0.3.0"]
    for name in PACKAGES:
        if name != "infra" and requirement(ws, name, "krea2-infra"):
            notes = (ws / "packages" / name / "CHANGELOG.md").read_text()
            assert "- Requires `krea2-infra>=0.3.0`." in notes.split("## [0.1.0]")[0]
    assert version(ws, "krablet") == "0.1.0"  # dependents are not released by this
    dev = tomllib.loads((ws / "packages/infra/pyproject.toml").read_text())["dependency-groups"]
    assert dev["dev"][0] == "krea2-infra[torch,shards,tracking,gpu,k8s]"  # itself: untouched
    assert release(ws, "check-tag", "krea2-infra-v0.3.0").returncode == 0


def test_a_release_without_a_changelog_entry_is_refused(ws):
    clear_entries(ws, "krablet")
    before = snapshot(ws)
    proc = release(ws, "bump", "krablet", "patch")
    assert proc.returncode == 1
    assert "release refused" in proc.stderr and "no entry for 0.1.1" in proc.stderr
    assert "packages/krablet/CHANGELOG.md" in proc.stderr
    assert snapshot(ws) == before


def test_a_missing_changelog_is_refused(ws):
    (ws / "packages/rl/CHANGELOG.md").unlink()
    proc = release(ws, "bump", "rl", "patch", "--dry-run")
    assert proc.returncode == 1 and "CHANGELOG.md does not exist" in proc.stderr


@pytest.mark.parametrize("how", ["0.1.0", "0.0.9", "1.2", "next"])
def test_a_version_that_does_not_move_forward_is_refused(ws, how):
    add_entry(ws, "dit")
    proc = release(ws, "bump", "dit", how)
    assert proc.returncode == 1 and "release refused" in proc.stderr
    assert version(ws, "dit") == "0.1.0"


def test_an_unknown_package_is_refused_with_the_choices(ws):
    proc = release(ws, "bump", "warehouse", "patch")
    assert proc.returncode == 1 and "choose from infra, krablet" in proc.stderr


def test_check_tag_refuses_a_tag_that_does_not_match_the_tree(ws):
    for tag, why in [
        ("krea2-dit-v0.2.0", "says version 0.1.0"),
        ("dit-0.1.0", "is not krea2-<name>-vX.Y.Z"),
        ("krea2-nope-v0.1.0", "names no package"),
    ]:
        proc = release(ws, "check-tag", tag)
        assert proc.returncode == 1 and why in proc.stderr, (tag, proc.stderr)


@pytest.mark.parametrize("name", PACKAGES)
def test_each_package_is_releasable_as_it_stands(name):
    """Version, ``__version__`` and a dated changelog entry agree (what a tag push checks)."""
    proc = release(ROOT, "check-tag", f"krea2-{name}-v{version(ROOT, name)}")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", PACKAGES)
def test_workspace_dependencies_have_a_satisfied_lower_bound(name):
    """Every ``krea2-*`` requirement has ``>=X.Y.Z`` (what the release script moves), <= current."""
    project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        if not spec.startswith("krea2-"):
            continue
        match = re.fullmatch(r"krea2-(\w+)(\[[\w,]+\])?>=(\d+)\.(\d+)\.(\d+)", spec)
        assert match, f"packages/{name}: {spec!r} needs a lower bound krea2-<dep>>=X.Y.Z"
        current = tuple(map(int, version(ROOT, match[1]).split(".")))
        assert tuple(map(int, match.groups()[2:])) <= current, spec
