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
from PIL import Image, UnidentifiedImageError

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
    hash), EXIF orientation applied, alpha composited (see ``alpha``), longest side at most
    ``analysis_size`` (never upscaled). ``width``/``height``: the
    original (oriented) size in pixels, from the header. ``alpha``: None for an image
    without alpha, else how it was composited: ``ALPHA_ON_WHITE``, or ``ALPHA_ON_BLACK``
    when the colour channels are uniform and the picture lives only in the alpha channel
    (on white it would be a blank page).
    """

    pixels: np.ndarray
    width: int
    height: int
    format: str
    mode: str
    animated: bool
    orientation: int
    alpha: str | None = None

    @property
    def scale(self) -> float:
        """Analysis pixels per original pixel along the longest side (≤ 1)."""
        return max(self.pixels.shape[:2]) / max(self.width, self.height)


ALPHA_ON_WHITE = "on white"
ALPHA_ON_BLACK = "on black: the picture is only in the alpha channel"
# Alpha counts as the picture when compositing on white leaves every channel within this
# many levels (the flat-colour filter's ±8) while alpha itself spans more.
ALPHA_ONLY_SPREAD = 16


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


def _area_resize(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``arr`` (h, w[, c]) area-resized to ``size`` = (width, height), if it differs."""
    if (arr.shape[1], arr.shape[0]) == size:
        return arr
    return cv2.resize(arr, size, interpolation=cv2.INTER_AREA)


def _composite(premultiplied: np.ndarray) -> tuple[np.ndarray, str]:
    """(h, w, c+1) uint8 premultiplied colour + alpha → ((h, w, c) composited, how).

    On white, unless that leaves a blank page while alpha carries a picture: then on black
    (premultiplied colour is the composite on black)."""
    colour, alpha = premultiplied[:, :, :-1], premultiplied[:, :, -1:]
    on_white = colour + (255 - alpha)  # premultiplied: colour <= alpha, so no overflow
    blank = int(on_white.max()) - int(on_white.min()) <= ALPHA_ONLY_SPREAD
    if blank and int(alpha.max()) - int(alpha.min()) > ALPHA_ONLY_SPREAD:
        return np.ascontiguousarray(colour), ALPHA_ON_BLACK
    return on_white, ALPHA_ON_WHITE


def _to_rgb(img: Image.Image, size: tuple[int, int]) -> tuple[np.ndarray, str | None]:
    """Any Pillow mode → ((height, width, 3) uint8 RGB at ``size`` = (width, height), alpha).

    Shrinks before any per-pixel arithmetic: 16-bit grey is area-resized as uint16 and then
    scaled (Pillow's convert("L") clips instead), alpha is premultiplied by Pillow and
    area-resized, then composited (``_composite``): compositing the shrunk premultiplied
    image equals shrinking the composite, at a fraction of the cost."""
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        arr = np.asarray(img)
        arr = _area_resize(arr if arr.dtype == np.uint16 else arr.astype(np.float32), size)
        arr = arr.astype(np.float64) / 257.0 if arr.max(initial=0) > 255 else arr
        grey = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2), None
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in img.info):
        if mode in ("P", "PA"):
            img = img.convert("RGBA")  # Pillow premultiplies RGBA and LA only
        if mode not in ("RGBa", "La"):
            img = img.convert("La" if mode == "LA" else "RGBa")
        rgb, how = _composite(_area_resize(np.asarray(img), size))
        return (np.repeat(rgb, 3, axis=2) if rgb.shape[2] == 1 else rgb), how
    if mode != "RGB":
        img = img.convert("RGB")
    return _area_resize(np.asarray(img), size), None


# EXIF orientation → the transpose that undoes it (as ImageOps.exif_transpose)
_ORIENTATION_FIX = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


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
    rgb, alpha = _to_rgb(img, _target_size(*img.size, limits.analysis_size))
    if orientation in _ORIENTATION_FIX:  # on the small pixels, after the shrink
        rgb = np.asarray(Image.fromarray(rgb).transpose(_ORIENTATION_FIX[orientation]))
        if orientation in (5, 6, 7, 8):
            w, h = h, w
    return DecodedImage(
        pixels=frozen(rgb),
        width=w,
        height=h,
        format=fmt,
        mode=mode,
        animated=animated,
        orientation=orientation,
        alpha=alpha,
    )
