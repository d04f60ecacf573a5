"""Check what a krea2 package's wheel ships: its own package, py.typed, the licence, nothing else.

    python3 scripts/check_wheel.py dist/krea2_infra-0.1.0-py3-none-any.whl [...]

Standard library only, so CI runs it with any Python. Exit 1 lists every problem found.
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

LICENSE_EXPRESSION = "Apache-2.0"
# Names that mark test code or test data; none may ship in a wheel.
TEST_PARTS = {"tests", "test", "fixtures", "testdata", "conftest.py"}
TEST_FILE = re.compile(r"^test_.*\.py$|^.*_test\.py$")
# Bytecode, editor and VCS droppings that a clean build never contains.
JUNK = re.compile(r"(^|/)(__pycache__|\.git|\.ipynb_checkpoints)(/|$)|\.py[co]$|~$")


def package_of(wheel: Path) -> str:
    """``krea2_infra-0.1.0-py3-none-any.whl`` -> ``infra``."""
    dist = wheel.name.split("-", 1)[0]
    if not dist.startswith("krea2_"):
        raise ValueError(f"{wheel.name}: not a krea2 package wheel (expected krea2_<name>-...)")
    return dist.removeprefix("krea2_")


def problems(wheel: Path) -> list[str]:
    """Every reason ``wheel`` should not be published (empty when it is fine)."""
    name = package_of(wheel)
    found: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        files = [n for n in archive.namelist() if not n.endswith("/")]
        dist_info = {n.split("/", 1)[0] for n in files if n.split("/", 1)[0].endswith(".dist-info")}
        if len(dist_info) != 1:
            return [f"expected one .dist-info directory, found {sorted(dist_info)}"]
        (info,) = dist_info
        metadata = HeaderParser().parsestr(archive.read(f"{info}/METADATA").decode())
    package_dir = f"krea2/{name}/"
    for path in files:
        parts = PurePosixPath(path).parts
        if path.startswith(f"{info}/"):
            continue
        if not path.startswith(package_dir):
            found.append(f"{path}: outside {package_dir} (tests, configs or another package)")
        if TEST_PARTS.intersection(parts) or TEST_FILE.match(parts[-1]):
            found.append(f"{path}: test code or test data")
        if JUNK.search(path):
            found.append(f"{path}: build junk")
    if "krea2/__init__.py" in files:
        found.append("krea2/__init__.py: krea2 is a namespace package shared by seven wheels")
    if f"{package_dir}py.typed" not in files:
        found.append(f"{package_dir}py.typed missing: type checkers would ignore the annotations")
    if f"{package_dir}__init__.py" not in files:
        found.append(f"{package_dir}__init__.py missing")
    if not any(n.startswith(f"{info}/licenses/LICENSE") for n in files):
        found.append(f"{info}/licenses/LICENSE missing: add packages/{name}/LICENSE")
    if metadata.get("License-Expression") != LICENSE_EXPRESSION:
        found.append(
            f"METADATA License-Expression is {metadata.get('License-Expression')!r}, "
            f"expected {LICENSE_EXPRESSION!r}"
        )
    if metadata.get("Name") != f"krea2-{name}":
        found.append(f"METADATA Name is {metadata.get('Name')!r}, expected 'krea2-{name}'")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    failed = 0
    for arg in argv:
        wheel = Path(arg)
        found = problems(wheel)
        for problem in found:
            print(f"{wheel.name}: {problem}", file=sys.stderr)
        print(f"{wheel.name}: {'FAIL' if found else 'ok'}")
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
