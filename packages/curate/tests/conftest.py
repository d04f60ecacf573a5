"""Shared fixtures: real photos from installed wheels and the corrupt-file corpus."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def _package_dir(name: str) -> Path:
    """A package's directory, found without importing it (sklearn takes seconds to import)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, f"{name} is not installed"
    return Path(spec.origin).parent


def _real_photo_paths() -> list[Path]:
    sk = _package_dir("skimage") / "data"
    names = [
        "astronaut.png",
        "chelsea.png",
        "coffee.png",
        "rocket.jpg",
        "hubble_deep_field.jpg",
        "retina.jpg",
        "ihc.png",
        "motorcycle_left.png",
        "camera.png",
        "coins.png",
        "moon.png",
        "page.png",
        "brick.png",
        "grass.png",
        "gravel.png",
        "text.png",
        "logo.png",
        "color.png",
    ]
    paths = [sk / n for n in names]
    paths += sorted((_package_dir("sklearn") / "datasets" / "images").glob("*.jpg"))
    mpl = _package_dir("matplotlib") / "mpl-data" / "sample_data"
    paths += [mpl / "grace_hopper.jpg", mpl / "Minduka_Present_Blue_Pack.png"]
    return [p for p in paths if p.exists()]


@pytest.fixture(scope="session")
def real_photos() -> dict[str, bytes]:
    """Bundled real photos and scans (scikit-image, scikit-learn, matplotlib): name → bytes."""
    photos = {p.name: p.read_bytes() for p in _real_photo_paths()}
    assert len(photos) >= 15, sorted(photos)
    return photos


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def png_declaring(width: int, height: int) -> bytes:
    """A valid-looking PNG header declaring width×height with only a few bytes of data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def _encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def photo_rgb(real_photos: dict[str, bytes]) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(real_photos["chelsea.png"])).convert("RGB"))


@pytest.fixture(scope="session")
def corrupt_corpus(real_photos: dict[str, bytes]) -> dict[str, tuple[bytes, str | None]]:
    """Bad and awkward inputs: name → (bytes, expected reject reason or None if decodable)."""
    rgb = photo_rgb(real_photos)
    img = Image.fromarray(rgb)
    jpeg = _encode(img, "JPEG", quality=90)
    png = _encode(img, "PNG")
    palette = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette.info["transparency"] = 0
    frames = [Image.new("RGB", (64, 48), c) for c in ("red", "green", "blue")]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    grey16 = Image.fromarray(np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16)
    return {
        "truncated.jpg": (jpeg[: len(jpeg) // 2], "truncated"),
        "truncated.png": (png[: len(png) // 2], "truncated"),
        "zero.jpg": (b"", "empty"),
        "text.jpg": (b"hello, this is a text file and not a JPEG\n" * 20, "not_an_image"),
        "html.png": (b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n", "not_an_image"),
        "bomb.png": (png_declaring(30000, 30000), "too_many_pixels"),
        "cmyk.jpg": (_encode(img.convert("CMYK"), "JPEG", quality=90), None),
        "grey16.png": (_encode(grey16, "PNG"), None),
        "palette_alpha.png": (_encode(palette, "PNG"), None),
        "animated.gif": (gif.getvalue(), None),
    }


@pytest.fixture(scope="session")
def ocr_engine():
    """One rapidocr engine for the whole session (creating one costs 1–2 s)."""
    from krea2.curate.ocr import OcrEngine

    return OcrEngine()
