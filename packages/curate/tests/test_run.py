"""`krea2 curate run` as a user meets it: an overloaded machine, timeouts, Ctrl-C/SIGTERM."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.shapes import make_pool, write_pool
from krea2.infra.pause import pause_env, wait_for_pause

KREA2 = str(Path(sys.executable).parent / "krea2")


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _photo_dir(tmp_path: Path, real_photos: dict[str, bytes]) -> Path:
    directory = tmp_path / "photos"
    directory.mkdir()
    for name, data in real_photos.items():
        (directory / name).write_bytes(data)
    return directory


def test_twice_as_many_processes_as_cpus_mark_no_good_photo_broken(
    tmp_path, cluster_file, real_photos
):
    # A 2 s bound: before the fix it counted while the workers started (several seconds on
    # a loaded machine), so images timed out without having run; none needs 0.2 s of CPU.
    c = str(cluster_file)
    _invoke("ingest", str(_photo_dir(tmp_path, real_photos)), "--name", "photos", "--cluster", c)
    processes = str(2 * (os.cpu_count() or 1))
    out = _invoke(
        "run", "--stages", "analyze", "--processes", processes, "--batch-size", "8",
        "--set", "decode.max_seconds=2", "--cluster", c,
    )  # fmt: skip
    wh = curate.open_warehouse(c)
    rows = curate.read_rows(wh, ["reject", "decode_error", "reason"])
    wh.close()
    assert len(rows) == len(real_photos)
    assert [r for r in rows if r["reject"] in ("broken", "truncated")] == []
    assert "0 timed out or crashed" in out


def _slow_png() -> bytes:
    noise = np.random.default_rng(0).integers(0, 256, (2000, 2000, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def test_timeouts_are_reported_and_can_be_run_again(tmp_path, cluster_file, real_photos):
    c = str(cluster_file)
    directory = tmp_path / "photos"
    directory.mkdir()
    (directory / "noise.png").write_bytes(_slow_png())
    (directory / "coffee.png").write_bytes(real_photos["coffee.png"])
    _invoke("ingest", str(directory), "--name", "photos", "--cluster", c)
    # 1 ms of CPU: the 2000x2000 PNG cannot be decoded in it
    out = _invoke("run", "--stages", "analyze", "--set", "decode.max_seconds=0.001", "--cluster", c)
    assert "timed out or crashed" in out and "--retry-timeouts" in out
    wh = curate.open_warehouse(c)
    timed_out = curate.isolation_failures(wh)
    assert timed_out >= 1
    out = _invoke("run", "--stages", "analyze", "--retry-timeouts", "--cluster", c)
    assert f"{timed_out} images queued again" in out
    rows = curate.read_rows(wh, ["decode_error"])
    assert all(r["decode_error"] is None for r in rows)
    assert curate.isolation_failures(wh) == 0
    wh.close()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_with_work_left_exits_non_zero_says_how_far_and_a_rerun_resumes(
    tmp_path, cluster_file, signum, code
):
    directory = tmp_path / "pool"
    write_pool(make_pool(seed=5, n_clean=60, n_per_defect=0, n_overrepresented=0), directory)
    c = str(cluster_file)
    _invoke("ingest", str(directory), "--name", "pool", "--cluster", c)
    cmd = [KREA2, "curate", "run", "--stages", "analyze,dedup", "--batch-size", "2",
           "--cluster", c]  # fmt: skip
    notice = tmp_path / "paused"
    # the analyze worker holds its second batch (claimed) once the first is written
    env = os.environ | {"KREA2_PROGRESS": "off"} | pause_env("krablet images.analyze", 1, notice)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    wh = curate.open_warehouse(c)
    wait_for_pause(notice, proc, timeout_s=120)
    os.killpg(proc.pid, signum)  # as Ctrl-C does: the whole process group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, (stdout, stderr)
    assert "interrupted" in stderr
    assert "analyze:" in stdout and "rows done" in stdout and "rerun" in stdout
    progress = curate.stage_progress(wh, ["analyze", "dedup"])
    assert progress["analyze"][0] < progress["analyze"][1] == 60
    assert not curate.is_complete(wh, ["analyze", "dedup"])
    _invoke("run", "--stages", "analyze,dedup", "--cluster", c)
    assert curate.is_complete(wh, ["analyze", "dedup"])
    assert curate.stage_progress(wh, ["analyze"])["analyze"] == (60, 60)
    wh.close()
