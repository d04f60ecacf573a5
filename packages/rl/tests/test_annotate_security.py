"""`krea2 rl annotate` against the probes of issue #38 (M5, L): files only from the images
folder and only images, a token off loopback, the Host checked, and no state change from a
cross-site form or a request without the page's session key. Real HTTP on loopback."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from PIL import Image

from krea2.infra.host import run_cli
from krea2.rl import TokenRequired
from krea2.rl.cli import app as rl_app
from krea2.rl.preference import AnnotationSession, annotate_app, open_pairs, write_pairs

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import toy_pairs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _serving(make_app, **kwargs) -> Iterator[str]:
    """``make_app(port=…)`` served by uvicorn on a free loopback port; yields the URL."""
    port = _free_port()
    config = uvicorn.Config(make_app(port=port, **kwargs), host="127.0.0.1", port=port,
                            log_level="error")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the annotation page did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def setup(cluster_file, tmp_path):
    """Four pairs under ``tmp_path/png``; pair 1's winner names a PNG outside that folder,
    pair 2's a symlink inside it to that PNG, pair 3's a text file named ``.png``."""
    folder = tmp_path / "png"
    pairs = toy_pairs(folder, 4)
    outside = tmp_path / "outside" / "secret.png"
    outside.parent.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(outside)
    (folder / "link.png").symlink_to(outside)
    (folder / "fake.png").write_text("not an image: a secret\n")
    pairs[1] = replace(pairs[1], winner_uri=f"file://{outside}")
    pairs[2] = replace(pairs[2], winner_uri=f"file://{folder / 'link.png'}")
    pairs[3] = replace(pairs[3], winner_uri=str(folder / "fake.png"))
    wh = open_pairs(str(cluster_file))
    write_pairs(wh, pairs)
    session = AnnotationSession(wh, annotator="tester", images=folder)
    yield session, pairs
    wh.close()


def _page(session: AnnotationSession):
    return lambda **kw: annotate_app(session, **kw)


def _key(url: str, client: httpx.Client | None = None) -> str:
    html = (client or httpx).get(f"{url}/").text
    return re.search(r'name="krea2-session" content="([^"]+)"', html).group(1)


def test_only_image_files_inside_the_images_folder_are_served(setup):
    session, pairs = setup
    with _serving(_page(session)) as url:
        ok = httpx.get(f"{url}/image/{pairs[0].pair_id}/winner")
        assert ok.status_code == 200 and ok.headers["content-type"] == "image/png"
        for pair in pairs[1:]:  # outside, a symlink out, a text file named .png
            r = httpx.get(f"{url}/image/{pair.pair_id}/winner")
            assert r.status_code == 404 and b"secret" not in r.content
        assert httpx.get(f"{url}/image/{pairs[1].pair_id}/loser").status_code == 200
    assert session.unservable() == [pairs[1].pair_id, pairs[2].pair_id]  # the files that escape


def test_a_cross_site_form_post_cannot_undo(setup):
    session, pairs = setup
    with _serving(_page(session)) as url:
        key = _key(url)
        headers = {"x-krea2-session": key}
        choose = {"pair_id": pairs[0].pair_id, "side": "left"}
        assert httpx.post(f"{url}/api/choose", json=choose, headers=headers).status_code == 200
        form = httpx.post(f"{url}/api/undo", data={"x": "1"})  # what a foreign page can send
        assert form.status_code == 415
        keyless = httpx.post(f"{url}/api/undo", json={})
        assert keyless.status_code == 403 and "x-krea2-session" in keyless.json()["detail"]
        cross = httpx.post(f"{url}/api/undo", json={}, headers={**headers,
                           "sec-fetch-site": "cross-site"})  # fmt: skip
        assert cross.status_code == 403
        assert httpx.get(f"{url}/api/state").json()["done"] == 1  # nothing was undone
        assert httpx.post(f"{url}/api/undo", json={}, headers=headers).json()["done"] == 0


def test_a_host_header_naming_another_site_is_refused(setup):
    session, _ = setup
    with _serving(_page(session)) as url:
        port = url.rsplit(":", 1)[1]
        for host in (f"evil.example:{port}", "127.0.0.1:1"):  # DNS rebinding; another port
            r = httpx.get(f"{url}/api/state", headers={"host": host})
            assert r.status_code == 400 and "not this page's address" in r.json()["detail"]
        assert httpx.get(f"{url}/api/state", headers={"host": f"localhost:{port}"}).is_success


def test_a_post_body_over_its_cap_is_a_413_and_bad_json_a_400(setup):
    session, _ = setup
    with _serving(_page(session)) as url:
        headers = {"x-krea2-session": _key(url), "content-type": "application/json"}
        big = httpx.post(f"{url}/api/choose", content=b" " * 20_000, headers=headers)
        assert big.status_code == 413
        deep = httpx.post(f"{url}/api/choose", content=b"[" * 10_000, headers=headers)
        assert deep.status_code == 400


def test_with_a_token_the_page_needs_it_once_then_a_cookie(setup):
    session, _ = setup
    with (
        _serving(_page(session), token="sesame") as url,
        httpx.Client(follow_redirects=True) as browser,
    ):
        assert browser.get(f"{url}/").status_code == 401
        assert browser.get(f"{url}/api/state").status_code == 401
        assert browser.get(f"{url}/?token=wrong").status_code == 401
        opened = browser.get(f"{url}/?token=sesame")  # follows the redirect to /
        assert opened.status_code == 200 and "sesame" not in str(opened.url)
        assert "sesame" not in str(browser.cookies)  # a digest, never the token
        assert browser.get(f"{url}/api/state").status_code == 200
        bearer = httpx.get(f"{url}/api/state", headers={"Authorization": "Bearer sesame"})
        assert bearer.status_code == 200


def test_binding_off_loopback_needs_a_token(setup, capsys, monkeypatch):
    session, _ = setup
    with pytest.raises(TokenRequired, match="KREA2_ANNOTATE_TOKEN"):
        annotate_app(session, host="0.0.0.0")
    annotate_app(session, host="0.0.0.0", token="sesame")  # with one: fine
    monkeypatch.delenv("KREA2_ANNOTATE_TOKEN", raising=False)
    # no --cluster: the refusal comes before any table is opened
    assert run_cli(rl_app, ["annotate", "--host", "0.0.0.0", "--images", "."]) == 2
    assert "--token" in capsys.readouterr().err
