"""Render an HTML file in headless Chromium and capture a screenshot and console errors."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Rendering:
    screenshot: Path
    dom: str
    stderr: str


def render_page(page: Path, screenshot: Path, width: int = 1200, height: int = 2400) -> Rendering:
    """Load ``page`` (a local file) offline, save a PNG screenshot and return the final DOM."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    url = page.resolve().as_uri()
    with tempfile.TemporaryDirectory() as profile:
        base = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
        shot = subprocess.run(
            [*base, f"--screenshot={screenshot}", f"--window-size={width},{height}", url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        dom = subprocess.run(
            [*base, "--dump-dom", url], capture_output=True, text=True, timeout=120
        )
    if shot.returncode != 0 or not screenshot.is_file():
        raise RuntimeError(f"chromium failed to render {page}: {shot.stderr[-2000:]}")
    return Rendering(screenshot, dom.stdout, shot.stderr + dom.stderr)
