"""Running `krea2 demo --quick` from the cross-package tests, and the plain run that the
interrupted one is compared with, made once per test session whichever worker asks first."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path

DEMO = [sys.executable, "-c", "from krea2.infra.host import main; main()", "demo", "--quick"]


def run_demo(out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [*DEMO, "--out", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def plain_run_to_export(root: Path) -> tuple[Path, dict]:
    """A plain `krea2 demo --quick --until export-64` under ``root`` (a folder every xdist
    worker of the session shares) and its exit status and output tails. The first caller
    runs it holding a file lock; a caller on another worker waits on the lock and reads
    the record, so the run costs its minutes once, on whichever worker gets there first
    (tests/test_demo_plain.py asks for it early, off the worker busy with the stopped runs)."""
    out, record = root / "demo-uninterrupted", root / "demo-uninterrupted.json"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "demo-uninterrupted.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.exists():
            result = run_demo(out, "--until", "export-64")
            record.write_text(json.dumps({
                "returncode": result.returncode,
                "stdout": result.stdout[-3000:],
                "stderr": result.stderr[-3000:],
            }))  # fmt: skip
    return out, json.loads(record.read_text())
