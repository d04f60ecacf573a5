"""Each library installs alone: the wheels build, and infra + krablet install without torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("infra", "krablet", "curate", "dit", "trainer", "rl", "expander")

pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(os.environ.get("KREA2_OFFLINE") == "1", reason="KREA2_OFFLINE=1"),
    pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH"),
]


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    run("uv", "build", "--all-packages", "--wheel", "--out-dir", str(out), cwd=ROOT)
    return {w.name.split("-")[0]: w for w in out.glob("*.whl")}


def test_build_all_packages_gives_eight_wheels(wheels):
    assert set(wheels) == {"krea2"} | {f"krea2_{name}" for name in PACKAGES}


def test_infra_and_krablet_install_alone_without_torch(wheels, tmp_path):
    venv = tmp_path / "venv"
    run("uv", "venv", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    run(
        "uv",
        "pip",
        "install",
        "--python",
        str(python),
        str(wheels["krea2_infra"]),
        str(wheels["krea2_krablet"]),
    )
    listed = run("uv", "pip", "list", "--python", str(python)).stdout.lower()
    assert "krea2-krablet" in listed and "krea2-infra" in listed
    assert "torch" not in listed.split()
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    assert no_torch.returncode != 0
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    help_text = run(str(venv / "bin" / "krea2"), "krablet", "--help", env=env).stdout
    assert "krablet" in help_text.lower()
    listing = run(str(venv / "bin" / "krea2"), "--help", env=env).stdout
    assert "dit" not in listing.split(), "only installed packages are listed"


@pytest.mark.slow  # a full install and the quick demo (~90 s); tests/test_demo.py runs it too
def test_installed_krea2_wheel_runs_the_quick_demo_outside_a_checkout(wheels, tmp_path):
    """`pip install krea2` (the eight wheels, dependencies pinned to the lock) into a fresh
    venv, then `krea2 demo --quick` from a directory with no checkout: the recipe is packaged."""
    constraints = tmp_path / "constraints.txt"
    run(
        "uv", "export", "--frozen", "--no-hashes", "--no-emit-workspace", "--no-dev",
        "-o", str(constraints), cwd=ROOT,
    )  # fmt: skip
    venv = tmp_path / "venv"
    run("uv", "venv", "--python", sys.executable, str(venv))
    run(
        "uv", "pip", "install", "--python", str(venv / "bin" / "python"),
        *map(str, wheels.values()), "-c", str(constraints),
    )  # fmt: skip
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    shown = run(str(venv / "bin" / "krea2"), "demo", "--quick", "--show-config", cwd=work, env=env)
    assert "[[train.stages]]" in shown.stdout
    out = work / "demo"
    run(str(venv / "bin" / "krea2"), "demo", "--quick", "--out", str(out), cwd=work, env=env)
    assert (out / "summary.json").is_file() and (out / "report.html").is_file()
