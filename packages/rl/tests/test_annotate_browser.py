"""``krea2 rl annotate`` in headless Chromium (driven over the DevTools protocol on a pipe):
keys and a click through three pairs with one undo land in the pairs table."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from krea2.rl.preference import (
    AnnotationSession,
    annotate_app,
    left_role,
    open_pairs,
    read_pairs,
    write_pairs,
)

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
from browser_screenshot import CHROMIUM_FLAGS, find_chromium
from pref_helpers import toy_pairs

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")


class Chromium:
    """Headless Chromium with the DevTools protocol on fds 3/4 (NUL-terminated JSON).

    Every exchange has a deadline: a browser that dies or stops answering fails the test
    in ``ANSWER_S`` seconds with its own log, instead of blocking on the pipe."""

    ANSWER_S = 60.0

    def __init__(self, url: str) -> None:
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        self.profile = tempfile.TemporaryDirectory()
        self.log = Path(self.profile.name) / "chromium.log"

        def fds() -> None:  # via fds >= 10, so neither pipe end is clobbered on the way
            import fcntl

            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [find_chromium(), *CHROMIUM_FLAGS, "--remote-debugging-pipe",
             f"--user-data-dir={self.profile.name}", url],
            preexec_fn=fds, pass_fds=(3, 4),  # kept open after fds() moves the pipes there
            stdout=subprocess.DEVNULL, stderr=(log := self.log.open("wb")),
            start_new_session=True,  # its renderer and helper processes: killed as a group
        )  # fmt: skip
        log.close()  # the child has its own copy
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf, self.next_id = b"", 0
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=page["targetId"],
                                 flatten=True)["sessionId"]  # fmt: skip

    def send(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        deadline = time.monotonic() + self.ANSWER_S
        data = json.dumps(msg).encode() + b"\0"
        while data:
            self.ready(deadline, write=True)
            data = data[os.write(self.to_chrome, data) :]
        while True:
            while b"\0" not in self.buf:
                self.ready(deadline, write=False)
                chunk = os.read(self.from_chrome, 65536)
                if not chunk:
                    self.fail(f"closed its pipe while answering {method}")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                assert "error" not in reply, reply
                return reply["result"]

    def ready(self, deadline: float, *, write: bool) -> None:
        """Wait until the pipe to (or from) Chromium can be written (read), or fail."""
        fd = self.to_chrome if write else self.from_chrome
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail(f"did not {'read' if write else 'answer'} in {self.ANSWER_S:.0f} s")
            if self.proc.poll() is not None:
                self.fail(f"exited with {self.proc.returncode}")
            r, w, _ = select.select([] if write else [fd], [fd] if write else [], [], min(left, 1))
            if r or w:
                return

    def fail(self, what: str) -> None:
        log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        raise AssertionError(f"chromium {what}; its log:\n{log}")

    def js(self, expr: str):
        r = self.send("Runtime.evaluate", self.session, expression=expr, returnByValue=True)
        return r["result"].get("value")

    def key(self, key: str, code: str) -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", self.session, type=kind, key=key, code=code)

    def click(self, selector: str) -> None:
        rect = f"document.querySelector('{selector}').getBoundingClientRect()"
        box = json.loads(self.js(f"JSON.stringify({rect})"))
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", self.session, type=kind, x=x, y=y,
                      button="left", clickCount=1)  # fmt: skip

    def wait(self, expr: str, timeout: float = 20.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if value := self.js(expr):
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expr}")

    def close(self) -> None:
        # Every Chromium process, not just the browser: a renderer left alive writes into
        # the profile while it is being removed ("Directory not empty"). Teardown: the test
        # is over, no assertion depends on the browser's state at this kill.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for _ in range(50):  # the group's last writes land as its processes die
            try:
                self.profile.cleanup()
                return
            except OSError:
                time.sleep(0.1)
        self.profile.cleanup()


def test_keys_a_click_and_an_undo_through_three_pairs(cluster_file, tmp_path):
    import uvicorn

    pairs = toy_pairs(tmp_path / "png", 4)
    wh = open_pairs(str(cluster_file))
    write_pairs(wh, pairs)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = AnnotationSession(wh, annotator="tester", images=tmp_path / "png")
    app = annotate_app(session, port=port)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    browser = Chromium(f"http://127.0.0.1:{port}/")
    try:
        ids = [p.pair_id for p in pairs]

        def at(i: int) -> None:
            browser.wait(f"document.body.dataset.pair === '{ids[i]}'")
            assert browser.js("document.getElementById('progress').textContent") == f"{i + 1} of 4"

        at(0)
        assert browser.wait("document.querySelector('#left img').naturalWidth") == 32
        browser.key("ArrowLeft", "ArrowLeft")  # pair 0: left is better
        at(1)
        browser.click("#right")  # pair 1: right is better ...
        at(2)
        browser.key("u", "KeyU")  # ... undone
        at(1)
        browser.key("ArrowRight", "ArrowRight")  # pair 1 again: right
        at(2)
        browser.key("s", "KeyS")  # pair 2: skip
        at(3)
    finally:
        browser.close()
        server.should_exit = True
        thread.join(10)
    got = {p.pair_id: (p.choice, p.annotator) for p in read_pairs(wh)}
    wh.close()
    flip = {"winner": "loser", "loser": "winner"}
    assert got[ids[0]] == (left_role(ids[0]), "tester")
    assert got[ids[1]] == (flip[left_role(ids[1])], "tester")
    assert got[ids[2]] == ("skip", "tester")
    assert got[ids[3]] == (None, None)
