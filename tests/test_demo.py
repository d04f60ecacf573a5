"""`krea2 demo --quick` end to end: killed mid-run, re-run to completion, report checked.

This is the cross-package integration test: embedded shards, a defect-laden pool, krablet
workers running the curate DAG, Parquet export at two resolutions, the trainer, sampling,
the rubric verifier and the report, through the packages' public commands and APIs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from browser_screenshot import find_chromium, render_page
from PIL import Image

DEMO = [sys.executable, "-c", "from krea2.infra.host import main; main()", "demo", "--quick"]


def run_demo(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*DEMO, "--out", str(out)], capture_output=True, text=True, timeout=900)


def kill_when(out: Path, record: str, timeout: float = 600) -> None:
    """Start the demo and SIGKILL it (and its workers) once stage ``record`` has finished."""
    proc = subprocess.Popen(
        [*DEMO, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            if (out / "stages" / f"{record}.json").exists():
                time.sleep(1.0)  # into the next stage
                break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    kill_when(out, "export-64")
    assert not (out / "summary.json").exists()
    before = json.loads((out / "stages" / "curate.json").read_text())
    result = run_demo(out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    after = json.loads((out / "stages" / "curate.json").read_text())
    assert after == before, "the finished curate stage was redone"
    assert "done earlier" in result.stderr
    return out


def test_summary_has_every_stage_and_curation_metrics(demo):
    summary = json.loads((demo / "summary.json").read_text())
    assert {
        "shards",
        "pool",
        "curate",
        "export-32",
        "export-64",
        "pretrain",
        "sample",
        "score",
    } <= set(summary["stages"])
    curation = summary["curation"]
    assert curation["images"] == summary["pool"]["images"]
    # Every one-object render is in the pool, labelled by the generator; those beyond each
    # concept's first render are scored apart from precision/recall, and byte-identical
    # re-renders are always folded.
    pool = summary["pool"]
    apart = curation["one_object_truth"]
    total = sum(sum(outcomes.values()) for outcomes in apart.values())
    assert total == pool["one_object"] - pool["one_object_by_label"]["clean"] > 0
    assert sum(apart.get("variant", {}).values()) == pool["one_object_by_label"].get("variant", 0)
    assert "kept" not in apart.get("exact_duplicate", {})
    for cls, m in curation["precision_recall"].items():
        assert m["support"] > 0, cls
        assert 0.0 <= m["precision"] <= 1.0 and 0.0 <= m["recall"] <= 1.0
    # The cheap filters and hash dedup are exact on the injected classes they own.
    for cls in ("broken", "truncated", "tiny", "flat", "exact_duplicate"):
        assert curation["precision_recall"][cls]["recall"] == 1.0, cls
    assert summary["export"]["32"]["rows"] > 0 and summary["export"]["64"]["rows"] > 0


def test_the_quick_run_says_it_is_a_smoke_run_in_summary_and_report(demo):
    note = json.loads((demo / "summary.json").read_text())["note"]
    assert note.startswith("Smoke run:") and "too few" in note
    report = (demo / "report.html").read_text()
    assert report.index("Smoke run:") < report.index("Curation funnel")


def test_shapes_eval_is_reported_for_baseline_and_each_stage(demo):
    evals = json.loads((demo / "summary.json").read_text())["shapes_eval"]
    assert list(evals) == ["untrained", "after pretrain-32", "after pretrain-64"]
    for e in evals.values():
        assert 0.0 <= e["shapes_eval"] <= 1.0
        assert {"object", "position"} <= set(e["by_kind"])
        assert len(e["prompts"]) > 0


def test_rows_survive_the_kill(demo):
    pool = json.loads((demo / "stages" / "pool.json").read_text())["result"]
    curated = json.loads((demo / "stages" / "curate.json").read_text())["result"]
    assert sum(curated["counts"].values()) == pool["images"]


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")
def test_report_renders_in_headless_chromium(demo):
    rendering = render_page(demo / "report.html", demo / "report.png", width=1100, height=1600)
    shot = np.asarray(Image.open(rendering.screenshot).convert("RGB"))
    assert shot.std() > 5
    for heading in ("Curation funnel", "ShapesEval on held-out prompts", "Training loss"):
        assert heading in rendering.dom
