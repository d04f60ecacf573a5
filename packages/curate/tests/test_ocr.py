"""OCR text density: the measures and the two stage filters, with and without the engine."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from krea2.curate.config import StageThresholds
from krea2.curate.ocr import OcrResult, TextLine, text_filters
from krea2.curate.shapes.render import _font


def _line(x0: float, y0: float, x1: float, y1: float, text: str = "HELLO") -> TextLine:
    box = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)
    return TextLine(text, 0.99, box)


def test_measures_of_an_ocr_result():
    r = OcrResult((_line(0, 0, 50, 10), _line(0, 5, 50, 25, "WORLD 2")), 100, 100)
    assert r.line_count == 2 and r.char_count == 11
    # The overlap is counted once (boxes include their edge pixels, hence the tolerance).
    assert r.box_area_fraction == pytest.approx(50 * 25 / 100**2, abs=0.01)
    assert r.median_line_height == 15.0
    assert r.text == "HELLO\nWORLD 2"
    assert OcrResult((), 10, 10).box_area_fraction == 0.0


def test_text_filters_at_a_stage():
    t = StageThresholds(max_text_area=0.15, min_text_height=6.0)
    dense = OcrResult(tuple(_line(0, y, 400, y + 14) for y in range(0, 400, 20)), 400, 400)
    f = {r.name: r for r in text_filters(dense, t, stage_side=256)}
    assert not f["text_density"].passed and f["text_legibility"].passed
    tiny = OcrResult((_line(0, 0, 60, 8),), 1024, 1024)  # 8 px lines in a 1024 px image
    f = {r.name: r for r in text_filters(tiny, t, stage_side=256)}  # → 2 px at 256
    assert f["text_density"].passed and not f["text_legibility"].passed
    assert "text height" in f["text_legibility"].reason
    none = text_filters(OcrResult((), 100, 100), t, 256)
    assert all(r.passed for r in none)


def test_the_engine_reads_dense_text_and_ignores_shapes(ocr_engine):
    img = Image.new("RGB", (320, 320), (20, 20, 20))
    draw = ImageDraw.Draw(img)
    draw.ellipse((200, 200, 300, 300), fill=(220, 40, 40))  # read as "O" unless filtered
    for i, y in enumerate(range(10, 150, 24)):
        draw.text((10, y), f"CURATE LINE {i} KREA", fill="white", font=_font(16))
    result = ocr_engine.read(np.asarray(img))
    assert result.line_count >= 5
    assert "KREA" in result.text
    assert all(line.text.strip() != "O" for line in result.lines)
    assert 0.05 < result.box_area_fraction < 0.5
