"""The demo report is one self-contained HTML file that renders in headless Chromium."""

from __future__ import annotations

import re

import numpy as np
import pytest
from browser_screenshot import find_chromium, render_page
from PIL import Image

from krea2.pipeline import html


def sample_page() -> str:
    rng = np.random.default_rng(0)
    images = [
        (html.png_data_uri(rng.integers(0, 255, (32, 32, 3))), f"sample {i}") for i in range(4)
    ]
    chart = html.line_chart(
        {"256": [(0, 1.0), (10, 0.5), (20, 0.2)], "512": [(20, 0.3), (30, 0.1)]}
    )
    return html.page(
        "krea2 demo",
        [
            ("Curation funnel", html.table(["reason", "rejected"], [["flat", 10], ["tiny", 3]])),
            ("Loss", chart),
            ("Samples", html.image_grid(images)),
        ],
    )


def test_report_is_self_contained():
    text = sample_page()
    assert "<svg" in text and "data:image/png;base64," in text
    # Nothing is fetched from elsewhere: no external src/href.
    assert not re.search(r'(src|href)="(https?:)?//', text)


def test_chart_handles_empty_and_flat_series():
    assert "no data" in html.line_chart({})
    assert "<polyline" in html.line_chart({"a": [(0, 1.0), (1, 1.0)]})


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")
def test_report_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(sample_page())
    rendering = render_page(page, tmp_path / "shot.png", width=900, height=900)
    shot = np.asarray(Image.open(rendering.screenshot).convert("RGB"))
    assert shot.shape[:2] == (900, 900)
    assert shot.std() > 5, "the screenshot is blank"
    assert "Curation funnel" in rendering.dom and "<svg" in rendering.dom
    assert "Uncaught" not in rendering.stderr
