"""Near-duplicate edits of real photos, and different views of one photo that are not copies.

The edit classes that hash dedup must group with their original (``EDIT_CLASSES``), each
drawn at random within its range and written as the file a copy would be: centre crops
keeping 85-95% of each side; overlays up to 3% of the frame (a white box with text in a
corner, a semi-transparent logo, a caption strip along the bottom); JPEG and WebP
re-encodes; resizes; brightness and contrast within ±12%. ``EXTRA_CLASSES`` are harder
variants reported beside them (off-centre and uneven crops, a crop plus an overlay).
``views`` cuts two windows of one photo that overlap by less than half: related content,
different pictures, never to be grouped. Used by ``benchmarks/near_dups.py`` and the tests.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFont

EDIT_CLASSES: tuple[str, ...] = (
    "crop",
    "overlay_box",
    "overlay_logo",
    "overlay_caption",
    "reencode",
    "resize",
    "tone",
)
EXTRA_CLASSES: tuple[str, ...] = ("crop_offcentre", "crop_uneven", "crop_and_overlay")
CAPTIONS = ("© stock photo", "Photo: J. Doe / Agency", "www.example.com", "SAMPLE")


def encode(img: Image.Image, fmt: str = "JPEG", **kw: object) -> bytes:
    """``img`` written as ``fmt`` (Pillow's writer and options)."""
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _crop(img: Image.Image, fx: float, fy: float, ox: float = 0.5, oy: float = 0.5):
    """Keep ``fx``/``fy`` of the width/height; ``ox``/``oy`` place the window (0.5: centred)."""
    w, h = img.size
    cw, ch = round(w * fx), round(h * fy)
    x, y = round((w - cw) * ox), round((h - ch) * oy)
    return img.crop((x, y, x + cw, y + ch))


def _font(size: float) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=max(6, int(size)))


def _box(img: Image.Image, area: float, rng: np.random.Generator) -> Image.Image:
    """A white box with dark text, 3:1, in a random corner with a 2% margin."""
    img = img.copy()
    w, h = img.size
    bw = int((area * w * h * 3) ** 0.5)
    bh = max(4, bw // 3)
    m = max(2, int(0.02 * min(w, h)))
    x = m if rng.random() < 0.5 else w - bw - m
    y = m if rng.random() < 0.5 else h - bh - m
    d = ImageDraw.Draw(img)
    d.rectangle((x, y, x + bw, y + bh), fill="white")
    d.text((x + 3, y + bh // 5), str(rng.choice(CAPTIONS)), fill=(20, 20, 20), font=_font(bh / 2))
    return img


def _logo(img: Image.Image, area: float, rng: np.random.Generator) -> Image.Image:
    """A semi-transparent (alpha 0.3-0.6) round logo with a coloured mark and a letter, in a
    corner or at the centre."""
    w, h = img.size
    s = int((area * w * h) ** 0.5)
    m = int(0.03 * min(w, h))
    x, y = [
        (w - s - m, h - s - m),
        (m, h - s - m),
        (w - s - m, m),
        ((w - s) // 2, (h - s) // 2),
    ][int(rng.integers(4))]
    a = int(255 * rng.uniform(0.3, 0.6))
    colour = tuple(int(c) for c in rng.integers(0, 256, 3))
    layer = Image.new("RGBA", img.size, (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    d.ellipse((x, y, x + s, y + s), fill=(255, 255, 255, a))
    d.rectangle((x + s // 4, y + s // 3, x + 3 * s // 4, y + 2 * s // 3), fill=(*colour, a))
    d.text((x + s // 3, y + s // 3), "K", fill=(0, 0, 0, a), font=_font(s / 3))
    return Image.alpha_composite(img.convert("RGBA"), layer).convert("RGB")


def _caption(img: Image.Image, area: float, rng: np.random.Generator) -> Image.Image:
    """A dark strip along the bottom edge, ``area`` of the frame, with a white credit line."""
    img = img.copy()
    w, h = img.size
    bh = max(4, int(area * h))
    d = ImageDraw.Draw(img)
    d.rectangle((0, h - bh, w, h), fill=(int(rng.integers(0, 40)),) * 3)
    d.text((6, h - bh), str(rng.choice(CAPTIONS)), fill="white", font=_font(bh * 0.8))
    return img


def _tone(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Brightness ×(1 ± 4-12%) and contrast ×(1 ± 0-10%) about mid-grey, clipped."""
    b = rng.choice([-1.0, 1.0]) * rng.uniform(0.04, 0.12)
    c = 1 + rng.uniform(-0.1, 0.1)
    x = np.asarray(img, np.float32) * (1 + b)
    x = (x - 128) * c + 128
    return Image.fromarray(np.clip(x + 0.5, 0, 255).astype(np.uint8))


def edit(img: Image.Image, kind: str, rng: np.random.Generator) -> bytes:
    """(RGB ``img``, one of ``EDIT_CLASSES`` or ``EXTRA_CLASSES``) → the edited copy's file."""
    q = int(rng.integers(85, 96))
    if kind == "crop":
        f = rng.uniform(0.85, 0.95)
        return encode(_crop(img, f, f), quality=q)
    if kind == "crop_offcentre":
        f = rng.uniform(0.85, 0.95)
        return encode(_crop(img, f, f, rng.uniform(0, 1), rng.uniform(0, 1)), quality=q)
    if kind == "crop_uneven":
        return encode(_crop(img, rng.uniform(0.85, 0.95), rng.uniform(0.85, 0.95)), quality=q)
    if kind == "crop_and_overlay":
        f = rng.uniform(0.85, 0.95)
        return encode(_box(_crop(img, f, f), rng.uniform(0.01, 0.03), rng), quality=q)
    if kind == "overlay_box":
        return encode(_box(img, rng.uniform(0.01, 0.03), rng), quality=q)
    if kind == "overlay_logo":
        return encode(_logo(img, rng.uniform(0.01, 0.03), rng), quality=q)
    if kind == "overlay_caption":
        return encode(_caption(img, rng.uniform(0.01, 0.03), rng), quality=q)
    if kind == "reencode":
        if rng.random() < 0.5:  # JPEG at half size, q 60-80
            half = img.resize((max(1, img.width // 2), max(1, img.height // 2)), Image.LANCZOS)
            return encode(half, quality=int(rng.integers(60, 81)))
        f = 1280 / max(img.size)  # WebP at 1280 px, q 70-90
        big = img.resize((round(img.width * f), round(img.height * f)), Image.LANCZOS)
        return encode(big, "WEBP", quality=int(rng.integers(70, 91)))
    if kind == "resize":
        f = rng.choice([rng.uniform(0.3, 0.8), rng.uniform(1.2, 2.0)])
        size = (max(1, round(img.width * f)), max(1, round(img.height * f)))
        return encode(img.resize(size, Image.BICUBIC), "PNG")
    if kind == "tone":
        return encode(_tone(img, rng), quality=q)
    raise ValueError(f"unknown edit {kind!r}; choose from {EDIT_CLASSES + EXTRA_CLASSES}")


def views(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, Image.Image]:
    """Two windows of one photo, each 55-65% of its long side and the whole short side,
    at the two ends of the long side: they share 10-30% of the long side, 18-46% of
    either window."""
    w, h = img.size
    f = rng.uniform(0.55, 0.65)
    if w >= h:
        return _crop(img, f, 1.0, 0.0), _crop(img, f, 1.0, 1.0)
    return _crop(img, 1.0, f, oy=0.0), _crop(img, 1.0, f, oy=1.0)
