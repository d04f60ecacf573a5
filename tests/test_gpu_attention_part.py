"""gpu.py's attention part runs its code path on the CPU: every kernel gets a row, a time
where it runs and the kernel's own refusal where it cannot (the prepared GPU script must
not meet its first bug on the lent card). Run as the scripts run: from the repository root,
where `benchmarks` is importable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = """
import json, torch
from benchmarks.gpu_attention import BACKENDS, attention_kernels, markdown_rows
rows = attention_kernels(torch.device("cpu"), side=32, repeat=1)
print(json.dumps({"backends": BACKENDS, "rows": rows, "table": markdown_rows(rows)}))
"""


def test_every_kernel_gets_a_row_with_a_time_or_its_refusal() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    rows = out["rows"]
    assert [(r["backend"], r["masked"]) for r in rows] == [
        (b, m) for b in out["backends"] for m in (False, True)
    ]
    assert all(r["tokens"] == 4 + 512 for r in rows)
    timed = {(r["backend"], r["masked"]) for r in rows if "ms" in r}
    assert {("auto", False), ("auto", True), ("flash", False)} <= timed
    for r in rows:
        if r["backend"] in ("cudnn", "efficient"):
            assert "only on CUDA" in r["error"], r
    table = out["table"]
    assert table[0][:2] == ["auto", "no"] and float(table[0][2]) > 0
    assert any(cell[2].startswith("— (") for cell in table)
