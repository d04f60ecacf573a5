"""The safe decode: every bad input gets a reason, awkward modes decode correctly."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from krea2.curate.decode import DecodeError, DecodeLimits, decode


def _jpeg(img: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95, **kw)
    return buf.getvalue()


def test_every_corrupt_input_gets_its_reason(corrupt_corpus):
    for name, (data, expected) in corrupt_corpus.items():
        if expected is None:
            continue
        with pytest.raises(DecodeError) as info:
            decode(data)
        assert info.value.reason == expected, name


def test_awkward_modes_decode_to_plausible_rgb(corrupt_corpus, real_photos):
    reference = np.asarray(Image.open(io.BytesIO(real_photos["chelsea.png"])).convert("RGB"))
    for name in ("cmyk.jpg", "palette_alpha.png"):
        out = decode(corrupt_corpus[name][0])
        assert out.pixels.dtype == np.uint8 and out.pixels.shape[2] == 3
        assert (out.width, out.height) == (reference.shape[1], reference.shape[0])
        small = np.asarray(Image.fromarray(reference).resize(out.pixels.shape[1::-1]))
        # CMYK round trip and a 16-colour palette are lossy but must keep the picture.
        assert np.abs(out.pixels.astype(int) - small).mean() < 25, name


def test_sixteen_bit_grey_is_scaled_not_clipped(corrupt_corpus):
    out = decode(corrupt_corpus["grey16.png"][0])
    stored = (np.arange(64 * 64).reshape(64, 64) * 16) / 257.0
    assert np.abs(out.pixels[:, :, 0].astype(float) - stored).max() <= 0.5 + 1e-9
    assert out.pixels.max() > 200  # a clipping convert would saturate at 255 early


def test_palette_transparency_is_composited_on_white():
    img = Image.new("P", (8, 8), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    img.info["transparency"] = 0
    img.paste(1, (0, 0, 4, 8))
    buf = io.BytesIO()
    img.save(buf, format="PNG", transparency=0)
    px = decode(buf.getvalue()).pixels
    assert (px[:, :4] == [255, 0, 0]).all() and (px[:, 4:] == 255).all()


def test_animated_gif_decodes_first_frame_and_is_marked(corrupt_corpus):
    out = decode(corrupt_corpus["animated.gif"][0])
    assert out.animated and (out.pixels == [255, 0, 0]).all()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(real_photos, orientation):
    upright = Image.open(io.BytesIO(real_photos["chelsea.png"])).convert("RGB")
    # Store the pixels so that applying `orientation` gives the upright picture back.
    inverse = {
        1: None,
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_90,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_270,
    }[orientation]
    stored = upright if inverse is None else upright.transpose(inverse)
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = decode(_jpeg(stored, exif=exif.tobytes()))
    assert out.orientation == orientation
    assert (out.width, out.height) == upright.size
    expected = np.asarray(upright.resize(out.pixels.shape[1::-1], Image.Resampling.BOX))
    assert np.abs(out.pixels.astype(int) - expected).mean() < 6


def test_jpeg_is_decoded_at_reduced_scale_but_reports_full_size(real_photos):
    big = Image.open(io.BytesIO(real_photos["chelsea.png"])).convert("RGB").resize((2000, 1330))
    out = decode(_jpeg(big), DecodeLimits(analysis_size=256))
    assert (out.width, out.height) == (2000, 1330)
    assert max(out.pixels.shape[:2]) == 256
    assert out.scale == pytest.approx(256 / 2000)


def test_declared_pixels_over_the_limit_are_rejected_before_decoding(real_photos):
    data = real_photos["astronaut.png"]
    with pytest.raises(DecodeError) as info:
        decode(data, DecodeLimits(max_pixels=100_000))
    assert info.value.reason == "too_many_pixels"


def test_oversized_files_are_rejected_unread():
    with pytest.raises(DecodeError) as info:
        decode(b"\xff" * 2048, DecodeLimits(max_bytes=1024))
    assert info.value.reason == "file_too_large"


def test_slow_decodes_time_out():
    noise = np.random.default_rng(0).integers(0, 256, (3000, 3000, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG", compress_level=1)
    with pytest.raises(DecodeError) as info:
        decode(buf.getvalue(), DecodeLimits(max_seconds=0.001))
    assert info.value.reason == "timeout"


def test_the_decode_time_bound_counts_cpu_time_not_waiting():
    from krea2.curate.decode import time_limit

    with time_limit(0.2):
        time.sleep(0.5)  # a busy machine: wall time passes, this process uses no CPU


def test_corpus_stays_under_the_memory_bound(corrupt_corpus, tmp_path: Path):
    """Decoding every bad file (and a 6000×6000 JPEG) in a fresh process grows RSS < 300 MiB."""
    for name, (data, _) in corrupt_corpus.items():
        (tmp_path / name).write_bytes(data)
    rng = np.random.default_rng(0)
    big = Image.fromarray(rng.integers(0, 256, (600, 600, 3), dtype=np.uint8)).resize((6000, 6000))
    (tmp_path / "big.jpg").write_bytes(_jpeg(big))
    script = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        from krea2.curate.decode import decode, DecodeError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for p in sorted(Path({str(tmp_path)!r}).iterdir()):
            try:
                decode(p.read_bytes())
            except DecodeError:
                pass
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) // 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) < 300, out.stdout


def _rgba_png(rgba: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _alpha_only_art(width: int, height: int) -> np.ndarray:
    """White colour everywhere; the drawing (rings and bars) is only in the alpha channel."""
    from PIL import ImageDraw

    alpha = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(alpha)
    for i in range(8):
        r = 20 + 18 * i
        box = (width // 2 - r, height // 2 - r, width // 2 + r, height // 2 + r)
        draw.ellipse(box, outline=255, width=5)
        draw.rectangle((20 + 40 * i, 20, 40 + 40 * i, 60 + 20 * i), fill=128 + 16 * i)
    rgba = np.full((height, width, 4), 255, np.uint8)
    rgba[:, :, 3] = np.asarray(alpha)
    return rgba


def test_artwork_that_lives_only_in_alpha_is_composited_on_black_and_kept():
    from krea2.curate.decode import ALPHA_ON_BLACK
    from krea2.curate.image_analysis import analyze_bytes

    data = _rgba_png(_alpha_only_art(640, 480))
    image = decode(data)
    assert image.alpha == ALPHA_ON_BLACK
    assert np.ptp(image.pixels) > 200  # a picture, not a blank page
    analysis = analyze_bytes(data)
    assert analysis.alpha == ALPHA_ON_BLACK and analysis.reject is None, analysis.reason


def test_ordinary_transparency_is_composited_on_white_after_shrinking(real_photos):
    from krea2.curate.decode import ALPHA_ON_WHITE

    rgb = np.asarray(Image.open(io.BytesIO(real_photos["astronaut.png"])).convert("RGB"))
    rgb = np.asarray(Image.fromarray(rgb).resize((2048, 2048)))
    alpha = np.tile(np.linspace(0, 255, 2048).astype(np.uint8), (2048, 1))
    image = decode(_rgba_png(np.dstack([rgb, alpha])))
    assert image.alpha == ALPHA_ON_WHITE and image.pixels.shape == (256, 256, 3)
    # the same as compositing at full size, then shrinking (up to rounding)
    a = alpha[:, :, None] / 255.0
    full = np.rint(rgb * a + 255.0 * (1 - a)).astype(np.uint8)
    import cv2

    expected = cv2.resize(full, (256, 256), interpolation=cv2.INTER_AREA)
    assert np.abs(image.pixels.astype(int) - expected).max() <= 2


def test_large_transparent_and_16_bit_images_are_shrunk_before_any_pixel_arithmetic():
    """Memory as the witness: compositing or scaling at full size allocates float copies
    (48 B per pixel before the fix); shrinking first leaves one copy of Pillow's buffer
    (≤ 8 B per pixel)."""
    import tracemalloc

    w, h = 2400, 1600
    rng = np.random.default_rng(0)
    grey16 = Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16))
    buf = io.BytesIO()
    grey16.save(buf, format="PNG", compress_level=1)
    rgba = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    for data in (_rgba_png(rgba), buf.getvalue()):
        tracemalloc.start()
        decode(data)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 12 * w * h, peak / (w * h)
