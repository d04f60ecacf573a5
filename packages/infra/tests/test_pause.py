"""Pause points: a program held at a named point of its work until a signal ends it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from krea2.infra.pause import pause_env, pause_target, wait_for_pause

LOOP = """
import sys
from krea2.infra.progress import progress
with progress("train toy", total=50, unit="step", interval_s=0) as bar:
    for step in range(50):
        bar.advance()
        print(f"did {step + 1}", flush=True)
print("finished", flush=True)
"""


def test_target_parses_label_and_count(monkeypatch):
    monkeypatch.setenv("KREA2_PAUSE_AT", "train pretrain-32:3")
    assert pause_target() == ("train pretrain-32", 3)
    monkeypatch.setenv("KREA2_PAUSE_AT", "curate ocr")
    assert pause_target() == ("curate ocr", 0)
    monkeypatch.delenv("KREA2_PAUSE_AT")
    assert pause_target() is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_progress_loop_holds_at_its_count_until_the_signal(tmp_path, sig):
    notice = tmp_path / "notice"
    env = {"PATH": "/usr/bin:/bin", "KREA2_PROGRESS": "plain", **pause_env("train toy", 7, notice)}
    proc = subprocess.Popen(
        [sys.executable, "-c", LOOP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    line = wait_for_pause(notice, proc, timeout_s=120)
    assert line.startswith("paused at train toy 7 (pid ")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert out.split() == [w for k in range(1, 7) for w in ("did", str(k))]  # held at 7
    assert "finished" not in out
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err and "(stopped)" in err
    else:
        assert proc.returncode == -signal.SIGKILL


def test_other_labels_and_an_unset_target_do_not_pause(tmp_path):
    notice = tmp_path / "notice"
    for env in ({}, pause_env("sample", 1, notice)):
        done = subprocess.run(
            [sys.executable, "-c", LOOP], capture_output=True, text=True, timeout=120,
            env={"PATH": "/usr/bin:/bin", **env},
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip().endswith("finished")
    assert not notice.exists()


def test_a_pause_ends_after_its_limit(tmp_path):
    notice = tmp_path / "notice"
    env = {"PATH": "/usr/bin:/bin", "KREA2_PAUSE_S": "0.2", **pause_env("train toy", 1, notice)}
    done = subprocess.run([sys.executable, "-c", LOOP], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0 and "finished" in done.stdout
    assert notice.read_text().startswith("paused at train toy 1")


def test_every_thread_holds_while_the_pause_lasts_and_an_event_ends_it(tmp_path, monkeypatch):
    import threading
    import time

    from krea2.infra import pause

    monkeypatch.setattr(pause, "_deadlines", {})
    notice = tmp_path / "notice"
    for key, value in pause_env("slot", 1, notice).items():
        monkeypatch.setenv(key, value)
    stop = threading.Event()
    held: list[float] = []

    def slot() -> None:
        pause.pause_point("slot", 1, until=stop)
        held.append(time.monotonic())

    threads = [threading.Thread(target=slot) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for_pause(notice, timeout_s=30)
    time.sleep(0.2)  # the threads are held, not racing: nothing can end them but `stop`
    assert held == [] and all(t.is_alive() for t in threads)
    released = time.monotonic()
    stop.set()
    for t in threads:
        t.join(10)
    assert len(held) == 3 and min(held) >= released
    assert notice.read_text().count("paused at slot") == 1  # announced once
    # a label pauses once: once ended, a later caller (with its own event) passes at once
    later = threading.Thread(
        target=pause.pause_point, args=("slot", 5, threading.Event()), daemon=True
    )
    later.start()
    later.join(30)  # against a hold of KREA2_PAUSE_S = 300 s
    assert not later.is_alive()
