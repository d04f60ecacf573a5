"""Run the numerics-sensitive tests again under other CPU kernels and thread counts.

A test that compares floats exactly (a loss that is log 2 at the reference, a ratio that is
1 on the first step, a measure repeated bit for bit) can pass on the machine it was written
on and fail on one whose CPU makes torch, oneDNN or MKL pick other kernels (AVX-512, AMX)
or another thread split. This reruns every test marked ``numerics`` under each setting
below, so such an assertion fails on any development machine, not first in CI on another.

    uv run python scripts/numerics_matrix.py            # every variant, 2 at a time
    uv run python scripts/numerics_matrix.py --list     # the variants and the test files
    uv run python scripts/numerics_matrix.py --only avx2-only --jobs 1

Exit status 0 when every variant passes; otherwise 1, with each failing variant's output.
``docs/testing.md`` says which tests are in the set and why.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"pytest\.mark\.numerics\b")

# name -> environment: each is a CPU this suite must pass on, or a thread split it must not
# depend on. ATEN_CPU_CAPABILITY picks torch's own vectorised kernels; ONEDNN_MAX_CPU_ISA and
# MKL_ENABLE_INSTRUCTIONS cap the GEMM and convolution libraries' instruction sets.
VARIANTS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "avx2-only": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "sse4": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "threads-1": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "threads-2": {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"},
}


def numerics_files() -> list[Path]:
    """Test files that hold a ``numerics`` mark, under packages/*/tests and tests/."""
    files = sorted(ROOT.glob("packages/*/tests/test_*.py")) + sorted(ROOT.glob("tests/test_*.py"))
    return [f for f in files if MARK.search(f.read_text(encoding="utf-8"))]


def run_variant(name: str, files: list[Path]) -> tuple[str, int, float, str]:
    """pytest -m numerics on ``files`` under variant ``name``: (name, exit, seconds, output)."""
    env = {**os.environ, **VARIANTS[name], "PYTHONDONTWRITEBYTECODE": ""}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "numerics",
           *[str(f.relative_to(ROOT)) for f in files]]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    return name, done.returncode, time.monotonic() - start, done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(VARIANTS),
                        help="run this variant (repeatable); default: all")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2, help="variants run at once")
    parser.add_argument("--list", action="store_true", help="print variants and files; run none")
    args = parser.parse_args(argv)
    files = numerics_files()
    names = args.only or list(VARIANTS)
    if args.list:
        for name in names:
            print(f"{name}: {' '.join(f'{k}={v}' for k, v in VARIANTS[name].items()) or '-'}")
        print("\n".join(str(f.relative_to(ROOT)) for f in files))
        return 0
    if not files:
        print("no test file carries the numerics mark", file=sys.stderr)
        return 1
    failed = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, code, seconds, out in pool.map(lambda n: run_variant(n, files), names):
            summary = out.strip().splitlines()[-1] if out.strip() else "(no output)"
            print(f"numerics {name}: {summary} ({seconds:.0f}s)", flush=True)
            if code != 0:
                failed.append((name, out))
    for name, out in failed:
        print(f"\n===== {name} ({VARIANTS[name]}) =====\n{out[-6000:]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
