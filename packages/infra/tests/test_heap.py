"""krea2.infra.heap: freed blocks stay in the process, so reallocating them does not fault."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Allocate, touch every page of, and free a 40 MiB block (over glibc's 32 MiB ceiling for
# its adaptive mmap threshold, so by default every round is a fresh mmap); count the minor
# page faults of rounds 2..N.
CHILD = """
import json, resource, sys
from krea2.infra.heap import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
size, page = 40 << 20, 4096
def touch():
    block = bytearray(size)
    block[::page] = bytes(len(range(0, size, page)))
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    touch()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "faults": faults}))
"""


def run_child(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_kept_memory_is_reused_without_page_faults():
    keep = run_child("keep")
    if not keep["applied"]:
        pytest.skip("the C library is not glibc")
    system = run_child("system")
    assert system["faults"] >= 100, system  # 10 fresh 40 MiB mappings
    assert keep["faults"] * 20 < system["faults"], (keep, system)


def test_keep_freed_memory_is_idempotent():
    from krea2.infra.heap import keep_freed_memory

    first = keep_freed_memory()
    assert keep_freed_memory() is first
