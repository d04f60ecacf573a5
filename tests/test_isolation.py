"""Each package's wheel: its contents, and that it installs and runs alone.

The fast tests check the checkers on hand-made wheels. The slow ones (``-m slow``) build
every wheel, check its contents, install it into a fresh venv with its declared
dependencies only (scripts/isolation.py: import every public module, ``krea2 <cmd>
--help``, no torch for infra/krablet/curate, no vLLM without the extra), and once more
with its workspace dependencies resolved at their lower bounds (``lowest-direct``).
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))


def script(name: str):
    """A module of scripts/ (they are scripts, not a package)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(
            f"_krea2_{name}", ROOT / "scripts" / f"{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "scripts"))


check_wheel = script("check_wheel")
isolation = script("isolation")


def make_wheel(tmp_path: Path, files: dict[str, str], *, license_expr="Apache-2.0") -> Path:
    wheel = tmp_path / "krea2_demo-0.1.0-py3-none-any.whl"
    info = "krea2_demo-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.4\nName: krea2-demo\nVersion: 0.1.0\n"
            f"License-Expression: {license_expr}\n",
        )
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


GOOD = {
    "krea2/demo/__init__.py": "",
    "krea2/demo/py.typed": "",
    "krea2/demo/sql/schema.sql": "-- package data",
    "krea2_demo-0.1.0.dist-info/licenses/LICENSE": "Apache License",
}


def test_a_clean_wheel_passes(tmp_path):
    assert check_wheel.problems(make_wheel(tmp_path, GOOD)) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tests/test_x.py": ""}, "outside krea2/demo/"),
        ({"krea2/demo/tests/test_x.py": ""}, "test code or test data"),
        ({"krea2/demo/fixtures/a.png": ""}, "test code or test data"),
        ({"configs/toy.toml": ""}, "outside krea2/demo/"),
        ({"krea2/demo/__pycache__/x.cpython-311.pyc": ""}, "build junk"),
        ({"krea2/__init__.py": ""}, "namespace package"),
    ],
)
def test_a_wheel_shipping_what_it_should_not_fails(tmp_path, change, expected):
    found = check_wheel.problems(make_wheel(tmp_path, {**GOOD, **change}))
    assert any(expected in problem for problem in found), found


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        ("krea2/demo/py.typed", "py.typed missing"),
        ("krea2_demo-0.1.0.dist-info/licenses/LICENSE", "licenses/LICENSE missing"),
    ],
)
def test_a_wheel_missing_py_typed_or_licence_fails(tmp_path, missing, expected):
    files = {k: v for k, v in GOOD.items() if k != missing}
    assert any(expected in p for p in check_wheel.problems(make_wheel(tmp_path, files)))


def test_a_wheel_without_the_licence_expression_fails(tmp_path):
    found = check_wheel.problems(make_wheel(tmp_path, GOOD, license_expr="MIT"))
    assert found == ["METADATA License-Expression is 'MIT', expected 'Apache-2.0'"]


def test_every_package_says_what_it_must_not_install():
    assert sorted(isolation.FORBIDDEN) == PACKAGES
    for name in ("infra", "krablet", "curate"):
        assert "torch" in isolation.FORBIDDEN[name]
    assert all("vllm" in forbidden for forbidden in isolation.FORBIDDEN.values())


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_ships_its_licence_and_py_typed(name):
    package = ROOT / "packages" / name
    assert (package / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert (package / "src" / "krea2" / name / "py.typed").is_file()
    assert not (package / "src" / "krea2" / "__init__.py").exists()


def test_a_lower_bound_without_a_release_tag_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match=r"has no release tag krea2-infra-v0\.0\.1"):
        isolation.wheel_at("infra", "0.0.1", tmp_path)


# --- slow: real wheels, fresh venvs -------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    isolation.build_wheels(PACKAGES, wheels)
    return wheels


@pytest.mark.slow
@pytest.mark.parametrize("name", PACKAGES)
def test_the_built_wheel_ships_only_its_package_with_py_typed_and_licence(built, name):
    (wheel,) = built.glob(f"krea2_{name}-*.whl")
    assert check_wheel.problems(wheel) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", PACKAGES)
def test_the_wheel_installs_and_runs_alone(built, tmp_path, name):
    result = isolation.check(name, tmp_path, built)
    assert result["problems"] == [], "\n".join(result["problems"])
    assert result["modules"] >= 1
    assert len(result["cli"]) == len(isolation.cli_commands(name)) + (name == "infra")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PACKAGES if n != "infra"])
def test_workspace_dependencies_at_their_lower_bounds_lowest_direct(built, tmp_path, name):
    result = isolation.check(name, tmp_path, built, lowest=True)
    assert result["problems"] == [], "\n".join(result["problems"])
    assert result["bounds"], f"krea2-{name} declares no workspace dependency"
