"""One safe decode per image: reduced-scale RGB pixels that every filter and hash reads."""

from __future__ import annotations

import contextlib
import io
import signal
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from krea2.curate.config import DecodeLimits
from krea2.curate.pixel_pass import frozen

# Formats we accept; anything else is "unsupported_format" (Pillow would otherwise try
# dozens of exotic plugins on arbitrary bytes).
# (Multi-picture JPEGs open through the JPEG plugin and report format "MPO".)
ALLOWED_FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF")

Image.init()  # load every plugin now, so `formats=` below can name WEBP/TIFF

# Reasons a decode can fail, the vocabulary of the `broken` filter.
DECODE_REASONS = (
    "empty",
    "file_too_large",
    "not_an_image",
    "too_many_pixels",
    "truncated",
    "corrupt",
    "timeout",
)


class DecodeError(Exception):
    """An image that cannot be decoded safely; ``reason`` is one of ``DECODE_REASONS``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        assert reason in DECODE_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class DecodedImage:
    """The one decode of an image.

    ``pixels``: (h, w, 3) uint8 RGB, C-contiguous and read-only (shared by every filter and
    hash), EXIF orientation applied, alpha composited on white, longest side at most
    ``analysis_size`` (never upscaled). ``width``/``height``: the
    original (oriented) size in pixels, from the header.
    """

    pixels: np.ndarray
    width: int
    height: int
    format: str
    mode: str
    animated: bool
    orientation: int

    @property
    def scale(self) -> float:
        """Analysis pixels per original pixel along the longest side (≤ 1)."""
        return max(self.pixels.shape[:2]) / max(self.width, self.height)


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``DecodeError('timeout')`` if the body uses more than ``seconds`` of CPU time.

    CPU time of this process (``ITIMER_PROF``), not wall time, so a busy machine slows a
    decode without timing it out. Uses SIGPROF, so it is enforced only on the main thread
    (elsewhere it is a no-op); Pillow decodes in Python-level chunks, so the signal lands
    between chunks (``krea2.curate.isolation`` bounds a child stuck in C code).
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGPROF, _raise)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    except _Timeout:
        raise DecodeError("timeout", f"decode used more than {seconds} s of CPU time") from None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _target_size(width: int, height: int, analysis_size: int) -> tuple[int, int]:
    longest = max(width, height)
    if longest <= analysis_size:
        return width, height
    f = analysis_size / longest
    return max(1, round(width * f)), max(1, round(height * f))


def _to_rgb(img: Image.Image) -> np.ndarray:
    """Any Pillow mode → (h, w, 3) uint8 RGB; alpha composited on white."""
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        arr = np.asarray(img)
        # 16-bit and 32-bit grey: Pillow's convert("L") clips instead of scaling.
        arr = arr.astype(np.float64) / 257.0 if arr.max(initial=0) > 255 else arr
        grey = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        mode == "P" and "transparency" in img.info
    )
    if has_alpha:
        rgba = np.asarray(img.convert("RGBA"), dtype=np.float32)
        alpha = rgba[:, :, 3:4] / 255.0
        rgb = rgba[:, :, :3] * alpha + 255.0 * (1.0 - alpha)
        return np.rint(rgb).astype(np.uint8)
    if mode != "RGB":
        img = img.convert("RGB")
    return np.asarray(img)


def decode(data: bytes, limits: DecodeLimits = DecodeLimits()) -> DecodedImage:
    """Decode ``data`` once, at reduced scale where the format allows (JPEG DCT scaling).

    Raises ``DecodeError`` with a reason for anything unreadable; never another exception
    for bad bytes.
    """
    if not data:
        raise DecodeError("empty", "zero bytes")
    if len(data) > limits.max_bytes:
        raise DecodeError("file_too_large", f"{len(data)} bytes > {limits.max_bytes}")
    with time_limit(limits.max_seconds):
        try:
            return _decode(data, limits)
        except DecodeError:
            raise
        except Image.DecompressionBombError as e:
            raise DecodeError("too_many_pixels", str(e)) from None
        except UnidentifiedImageError:
            raise DecodeError("not_an_image", "no supported image format recognised") from None
        except (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError) as e:
            msg = str(e)
            reason = "truncated" if "truncated" in msg or isinstance(e, EOFError) else "corrupt"
            raise DecodeError(reason, msg[:200]) from None
        except MemoryError:
            raise DecodeError("too_many_pixels", "out of memory while decoding") from None


def _decode(data: bytes, limits: DecodeLimits) -> DecodedImage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    w, h = img.size
    if w <= 0 or h <= 0:
        raise DecodeError("corrupt", f"declared size {w}x{h}")
    if w * h > limits.max_pixels:
        raise DecodeError("too_many_pixels", f"declared {w}x{h} > {limits.max_pixels} pixels")
    fmt, mode = img.format or "", img.mode
    orientation = int(img.getexif().get(0x0112, 1) or 1)
    animated = bool(getattr(img, "is_animated", False))
    if animated:
        img.seek(0)
    if fmt in ("JPEG", "MPO"):
        # DCT scaling: decode at 1/2, 1/4 or 1/8 while staying at or above the target.
        img.draft(img.mode, _target_size(w, h, limits.analysis_size))
    img.load()
    if orientation != 1:
        img = ImageOps.exif_transpose(img)
        if orientation in (5, 6, 7, 8):
            w, h = h, w
    rgb = _to_rgb(img)
    tw, th = _target_size(rgb.shape[1], rgb.shape[0], limits.analysis_size)
    if (tw, th) != (rgb.shape[1], rgb.shape[0]):
        rgb = cv2.resize(rgb, (tw, th), interpolation=cv2.INTER_AREA)
    return DecodedImage(
        pixels=frozen(rgb),
        width=w,
        height=h,
        format=fmt,
        mode=mode,
        animated=animated,
        orientation=orientation,
    )
