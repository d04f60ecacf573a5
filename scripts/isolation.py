"""Install one package's wheel alone, with its declared dependencies only, and prove it runs.

    python3 scripts/isolation.py dit [--work DIR] [--wheels DIR]

For package ``<name>``: build the wheels of ``krea2-<name>`` and of the workspace packages it
depends on, create a fresh venv, install those wheels with third-party versions constrained
to uv.lock (``uv export``) but nothing else, then in that venv import every public module,
run its ``krea2 <cmd> --help`` where it registers a CLI, and check that nothing it must not
pull in (torch for infra/krablet/curate, vLLM without the extra) was installed or imported.
Prints one JSON line with the result; exit 1 on any failure. Used by tests/test_isolation.py
(slow set), .ci/run and the per-package workflows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workspace import ROOT, Package, dist_name, load, upstream

# Distributions a package must not install without an extra (with the reason).
FORBIDDEN: dict[str, dict[str, str]] = {
    "infra": {"torch": "torch is the [torch] extra", "vllm": "no vLLM"},
    "krablet": {"torch": "the warehouse installs without torch", "vllm": "no vLLM"},
    "curate": {"torch": "torch is the [embed] extra", "vllm": "no vLLM"},
    "dit": {"vllm": "no vLLM"},
    "trainer": {"vllm": "no vLLM"},
    "rl": {"vllm": "no vLLM"},
    "expander": {"vllm": "vLLM is the [vllm] extra"},
}

# Runs inside the fresh venv: import every public module, report what failed and what loaded.
_PROBE = r"""
import importlib, json, pkgutil, sys, traceback
name, extra_modules = sys.argv[1], set(json.loads(sys.argv[2]))
needs_extra, failures = {}, {}

def attempt(label, load):
    # An import that fails only because an optional extra is absent is expected: record it.
    try:
        load()
        return True
    except ImportError as exc:
        missing = (getattr(exc, "name", None) or "").split(".")[0]
        if type(exc).__name__ == "MissingExtraError" or missing in extra_modules:
            needs_extra[label] = f"{type(exc).__name__}: {exc}"
        else:
            failures[label] = traceback.format_exc(limit=3)
    except Exception:
        failures[label] = traceback.format_exc(limit=3)
    return False

root = importlib.import_module(f"krea2.{name}")
modules = [root.__name__]
for info in pkgutil.walk_packages(root.__path__, prefix=f"krea2.{name}.", onerror=lambda n: None):
    if any(p.startswith("_") for p in info.name.split(".")):  # private and __main__: not API
        continue
    if attempt(info.name, lambda: importlib.import_module(info.name)):
        modules.append(info.name)
for export in getattr(root, "__all__", []):
    attempt(f"krea2.{name}.{export}", lambda: getattr(root, export))
print(json.dumps({"modules": modules, "failures": failures, "needs_extra": needs_extra,
                  "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


# Import names that differ from their distribution's name.
MODULE_OF = {
    "pyyaml": "yaml",
    "nvidia-ml-py": "pynvml",
    "opencv-python-headless": "cv2",
    "pillow": "PIL",
    "faiss-cpu": "faiss",
    "psycopg-pool": "psycopg_pool",
}


def optional_modules(packages: dict, names: list[str]) -> set[str]:
    """Import names of the distributions that only the extras of ``names`` bring."""
    dists = {dist_name(s) for n in names for specs in packages[n].extras.values() for s in specs}
    base = {dist_name(s) for n in names for s in packages[n].dependencies}
    return {MODULE_OF.get(d, d.replace("-", "_")) for d in dists - base}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def checked(cmd: list[str], **kw) -> str:
    proc = run(cmd, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def build_wheels(names: list[str], out: Path, root: Path = ROOT) -> dict[str, Path]:
    """``uv build --wheel`` each package into ``out`` (reused when already built)."""
    packages = load(root)
    wheels: dict[str, Path] = {}
    for name in names:
        pkg = packages[name]
        wheel = out / f"krea2_{name}-{pkg.version}-py3-none-any.whl"
        if not wheel.exists():
            checked(
                ["uv", "build", "--package", pkg.dist, "--wheel", "--out-dir", str(out), "-q"],
                cwd=root,
            )
        if not wheel.exists():
            raise RuntimeError(f"uv build did not produce {wheel.name} in {out}")
        wheels[name] = wheel
    return wheels


def lock_constraints(name: str, out: Path, root: Path = ROOT) -> Path:
    """The locked third-party versions of ``krea2-<name>``'s dependencies, as a constraints file."""
    path = out / f"constraints-{name}.txt"
    checked(
        [
            "uv",
            "export",
            "--frozen",
            "--package",
            f"krea2-{name}",
            "--no-dev",
            "--all-extras",
            "--no-emit-workspace",
            "--no-hashes",
            "--no-header",
            "-o",
            str(path),
            "-q",
        ],
        cwd=root,
    )
    return path


def fresh_venv(path: Path) -> Path:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    checked(["uv", "venv", "-q", "--clear", "--python", py, str(path)])
    return path / "bin" / "python"


def installed(python: Path) -> dict[str, str]:
    """Distribution name -> version in the venv of ``python``."""
    out = checked(["uv", "pip", "list", "--python", str(python), "--format", "json"])
    return {row["name"].lower(): row["version"] for row in json.loads(out)}


def cli_commands(name: str, root: Path = ROOT) -> list[str]:
    """The ``krea2 <cmd>`` sub-commands ``krea2-<name>`` registers (entry points ``krea2.cli``)."""
    project = tomllib.loads((root / "packages" / name / "pyproject.toml").read_text())["project"]
    return sorted(project.get("entry-points", {}).get("krea2.cli", {}))


LOWER_BOUND = re.compile(r"^(krea2-[a-z]+)(\[[^\]]*\])?>=(\d+\.\d+\.\d+)$")


def lower_bounds(pkg: Package) -> dict[str, tuple[str, str]]:
    """Workspace dependency name -> (its requirement string, its lower bound)."""
    found = {}
    for spec in pkg.dependencies:
        dist = dist_name(spec)
        if dist.startswith("krea2-"):
            match = LOWER_BOUND.match(spec.replace(" ", ""))
            if match is None:
                raise RuntimeError(f"{pkg.pyproject}: {spec!r} has no lower bound >=X.Y.Z")
            found[dist.removeprefix("krea2-")] = (spec, match.group(3))
    return found


def wheel_at(name: str, version: str, out: Path, root: Path = ROOT) -> Path:
    """``krea2-<name>`` at ``version`` as a wheel, built from the tree or its release tag."""
    wheel = out / f"krea2_{name}-{version}-py3-none-any.whl"
    if wheel.exists():
        return wheel
    if load(root)[name].version == version:
        return build_wheels([name], out, root)[name]
    tag = f"krea2-{name}-v{version}"
    with tempfile.TemporaryDirectory(prefix=f"krea2-{tag}-") as tmp:
        archive = run(["git", "-C", str(root), "archive", "--format=tar", tag])
        if archive.returncode != 0:
            raise RuntimeError(f"lower bound {version} of krea2-{name} has no release tag {tag}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, text=True, check=True)
        checked(["uv", "build", f"{tmp}/packages/{name}", "--wheel", "--out-dir", str(out), "-q"])
    return wheel


def smoke(
    name: str, python: Path, needed: list[str], work: Path, result: dict, root: Path = ROOT
) -> None:
    """In the environment of ``python``: nothing forbidden, every public module imports,
    every ``krea2 <cmd> --help`` runs. Problems are appended to ``result["problems"]``."""
    packages = load(root)
    dists = set(installed(python))
    result["installed"] = len(dists)
    for dist, why in FORBIDDEN[name].items():
        if dist in dists:
            result["problems"].append(f"installs {dist} ({why})")
    ours = {d for d in dists if d.startswith("krea2-")}
    if ours != {f"krea2-{n}" for n in needed}:
        result["problems"].append(f"krea2 distributions {sorted(ours)}, expected {needed}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    extra_modules = sorted(optional_modules(packages, [*needed]))
    probe = run([str(python), "-c", _PROBE, name, json.dumps(extra_modules)], env=env, cwd=work)
    if probe.returncode != 0:
        result["problems"].append(f"import krea2.{name} failed:\n{probe.stderr[-3000:]}")
    else:
        report = json.loads(probe.stdout.strip().splitlines()[-1])
        result["modules"] = len(report["modules"])
        for module, trace in report["failures"].items():
            result["problems"].append(f"import {module} failed:\n{trace}")
        result["needs_extra"] = report["needs_extra"]
        for dist in FORBIDDEN[name]:
            if dist in report["loaded"]:
                result["problems"].append(f"importing krea2.{name} loads {dist}")
    krea2 = python.parent / "krea2"
    commands = cli_commands(name, root)
    result["cli"] = []
    for cmd in ([[]] if name == "infra" else []) + [[c] for c in commands]:
        proc = run([str(krea2), *cmd, "--help"], env=env, cwd=work)
        label = " ".join(["krea2", *cmd, "--help"])
        result["cli"].append(label)
        if proc.returncode != 0 or "Usage" not in proc.stdout:
            result["problems"].append(f"{label} exit {proc.returncode}:\n{proc.stderr[-2000:]}")
        elif name != "infra" and cmd and cmd[0] not in run([str(krea2), "--help"], env=env).stdout:
            result["problems"].append(f"krea2 --help does not list {cmd[0]}")


def check(
    name: str, work: Path, wheels_dir: Path, root: Path = ROOT, *, lowest: bool = False
) -> dict:
    """Install ``krea2-<name>`` alone into ``work/venv-<name>``, check it, return the result.

    With ``lowest``, its workspace dependencies are resolved with ``--resolution
    lowest-direct`` from wheels at their declared lower bounds (third-party packages stay
    at the lock's versions) and must install at exactly those bounds.
    """
    start = time.monotonic()
    packages = load(root)
    needed = [n for n in packages if n == name or n in upstream(packages, name)]
    wheels = build_wheels(needed, wheels_dir, root)
    python = fresh_venv(work / f"venv-{name}{'-lowest' if lowest else ''}")
    constraints = lock_constraints(name, work, root)
    install = ["uv", "pip", "install", "-q", "--python", str(python), "-c", str(constraints)]
    bounds = lower_bounds(packages[name])
    if lowest:
        links = work / f"lowest-{name}"
        links.mkdir(exist_ok=True)
        for dep, (_, version) in bounds.items():
            shutil.copy(wheel_at(dep, version, wheels_dir, root), links)
        for other in needed:  # transitive workspace packages: any version, the newest wins
            shutil.copy(wheels[other], links)
        install += ["--find-links", str(links), "--resolution", "lowest-direct"]
        checked([*install, str(wheels[name]), *(spec for spec, _ in bounds.values())])
    else:
        checked([*install, *(str(wheels[n]) for n in needed)])
    result: dict = {"package": name, "problems": [], "lowest": lowest}
    versions = installed(python)
    if lowest:
        result["bounds"] = {dep: version for dep, (_, version) in bounds.items()}
        for dep, (_, version) in bounds.items():
            if versions.get(f"krea2-{dep}") != version:
                result["problems"].append(
                    f"lowest-direct installed krea2-{dep} {versions.get(f'krea2-{dep}')}, "
                    f"expected its lower bound {version}"
                )
    smoke(name, python, needed, work, result, root)
    result["seconds"] = round(time.monotonic() - start, 1)
    result["ok"] = not result["problems"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", help="package names, e.g. infra dit")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temp dir)")
    parser.add_argument("--wheels", type=Path, help="wheel directory (default: WORK/wheels)")
    parser.add_argument(
        "--in-env",
        action="store_true",
        help="check the running interpreter's environment instead of a fresh venv from wheels",
    )
    parser.add_argument(
        "--lowest", action="store_true", help="workspace deps at their lower bounds (lowest-direct)"
    )
    args = parser.parse_args(argv)
    known = load()
    unknown = [p for p in args.packages if p not in known]
    if unknown:
        parser.error(f"unknown package(s) {unknown}; choose from {list(known)}")
    if args.in_env:  # e.g. uv run --package krea2-dit --exact --no-dev python scripts/isolation.py
        failed = 0
        for name in args.packages:
            start = time.monotonic()
            result: dict = {"package": name, "env": sys.prefix, "problems": []}
            needed = [n for n in known if n == name or n in upstream(known, name)]
            smoke(name, Path(sys.executable), needed, Path.cwd(), result)
            result["seconds"] = round(time.monotonic() - start, 1)
            print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
            for problem in result["problems"]:
                print(f"  {name}: {problem}", file=sys.stderr)
            failed += bool(result["problems"])
        return 1 if failed else 0
    with tempfile.TemporaryDirectory(prefix="krea2-isolation-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        wheels = (args.wheels or work / "wheels").resolve()
        wheels.mkdir(parents=True, exist_ok=True)
        failed = 0
        for name in args.packages:
            result = check(name, work, wheels, lowest=args.lowest)
            print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
            for problem in result["problems"]:
                print(f"  {name}: {problem}", file=sys.stderr)
            failed += not result["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
