"""The defect injector: a raw ShapesWorld pool where every image carries a ground-truth label.

Labels are ``clean`` or one of ``DEFECT_CLASSES``; duplicates name the item they copy, so
filter and dedup precision/recall can be measured exactly.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw

from krea2.curate.shapes.copies import COPY_EDITS, copy_edit
from krea2.curate.shapes.render import _font, render
from krea2.curate.shapes.sample import sample_scene
from krea2.curate.shapes.spec import COLORS, WORDS, Scene, ShapeObject
from krea2.curate.sidecars import sidecar_path

DEFECT_CLASSES: tuple[str, ...] = (
    "broken",
    "truncated",
    "tiny",
    "extreme_aspect",
    "flat",
    "noise",
    "border",
    "exact_duplicate",
    "near_duplicate",
    "text_dense",
    "overrepresented",
)
# Copies that hashes miss (``shapes.copies``): injected only when ``make_pool(n_copies=...)``
# asks, so the default pool and its per-class checks are those of the hash stage.
SEMANTIC_DUPLICATE = "semantic_duplicate"
# The over-represented concept: every `overrepresented` item contains a red circle, and no
# other item does.
OVERREPRESENTED = ("red", "circle")
NEAR_DUPLICATE_EDITS = ("resize", "reencode", "crop", "shift")

# colorhash puts hues into 6 bins; scenes that differ only by a colour of the same bin
# (red/orange/yellow, cyan/blue) are indistinguishable to hash dedup by construction, so the
# clean pool keeps scene layouts distinct up to that bin.
_HUE_BIN = {
    "red": 0,
    "orange": 0,
    "yellow": 0,
    "green": 2,
    "cyan": 3,
    "blue": 3,
    "purple": 4,
    "pink": 5,
}


@dataclass(frozen=True)
class PoolItem:
    """One file of the raw pool: ``source`` is the key an (exact or near) duplicate copies,
    ``edit`` says how a near duplicate was made."""

    key: str
    data: bytes
    ext: str
    label: str
    source: str | None = None
    edit: str | None = None
    scene: Scene | None = None

    def meta(self) -> dict:
        return {
            "key": self.key,
            "file": f"{self.key}.{self.ext}",
            "label": self.label,
            "source": self.source,
            "edit": self.edit,
            "scene": self.scene.to_dict() if self.scene else None,
        }


def encode(pixels: np.ndarray, ext: str, quality: int = 90) -> bytes:
    """(h, w, 3) uint8 RGB → JPEG (``jpg``) or PNG (``png``) bytes."""
    buf = io.BytesIO()
    img = Image.fromarray(pixels)
    if ext == "jpg":
        img.save(buf, format="JPEG", quality=quality)
    else:
        img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _size(rng: np.random.Generator, lo: int, hi: int) -> tuple[int, int]:
    short = int(rng.integers(lo, hi + 1))
    long = int(short * rng.uniform(1.0, 1.5))
    return (long, short) if rng.random() < 0.5 else (short, long)


def _signature(scene: Scene) -> frozenset:
    return frozenset((_HUE_BIN[o.color], o.shape, o.cell) for o in scene.objects)


def _clean_scene(rng: np.random.Generator, seen: set) -> Scene:
    colors = [c for c in COLORS if c != OVERREPRESENTED[0]]
    while True:
        scene = sample_scene(rng, min_objects=2, max_objects=3, colors=colors, word_prob=0.3)
        sig = _signature(scene)
        if sig not in seen:
            seen.add(sig)
            return scene


def _overrepresented_scene(rng: np.random.Generator, seen: set) -> Scene:
    colors = [c for c in COLORS if c != OVERREPRESENTED[0]]
    while True:
        base = sample_scene(rng, min_objects=1, max_objects=2, colors=colors)
        free = sorted(set(range(9)) - {o.cell for o in base.objects})
        circle = ShapeObject(
            OVERREPRESENTED[1],
            OVERREPRESENTED[0],
            int(rng.choice(free)),
            str(rng.choice(["medium", "large"])),
            (float(rng.uniform(-0.5, 0.5)), float(rng.uniform(-0.5, 0.5))),
        )
        scene = Scene((*base.objects, circle), base.background)
        sig = _signature(scene)
        if sig not in seen:
            seen.add(sig)
            return scene


def _near_duplicate(pixels: np.ndarray, edit: str, rng: np.random.Generator) -> tuple[bytes, str]:
    h, w = pixels.shape[:2]
    if edit == "resize":
        f = rng.uniform(0.8, 0.95)
        out = cv2.resize(pixels, (round(w * f), round(h * f)), interpolation=cv2.INTER_AREA)
        return encode(out, "jpg", 90), "jpg"
    if edit == "reencode":
        return encode(pixels, "jpg", int(rng.integers(40, 71))), "jpg"
    if edit == "crop":
        # Hash dedup tolerates about 1% crop and 0.5% shift (docs/curate.md has the curve);
        # larger edits are the embedding dedup's job.
        dx, dy = (max(1, int(rng.uniform(0.005, 0.01) * s)) for s in (w, h))
        return encode(pixels[dy : h - dy, dx : w - dx], "jpg", 90), "jpg"
    # shift: translate by 0.3-0.6% with the edge replicated, so no border band appears.
    tx, ty = (float(rng.choice([-1, 1]) * rng.uniform(0.003, 0.006) * s) for s in (w, h))
    m = np.float32([[1, 0, tx], [0, 1, ty]])
    out = cv2.warpAffine(pixels, m, (w, h), borderMode=cv2.BORDER_REPLICATE)
    return encode(out, "jpg", 90), "jpg"


def _text_dense(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A block of small white text (a sign, a caption box) over 30–40% of the image height."""
    img = Image.fromarray(pixels)
    draw = ImageDraw.Draw(img)
    h = pixels.shape[0]
    size = int(rng.integers(14, 19))
    font = _font(size)
    block = int(h * rng.uniform(0.3, 0.4))
    y = int(rng.integers(size // 2, h - block))
    end = y + block
    while y < end - size:
        words = " ".join(str(rng.choice(list(WORDS))) for _ in range(10))
        draw.text((int(size * 0.5), y), words, fill=(255, 255, 255), font=font)
        y += int(size * 1.5)
    return np.asarray(img)


# A frame's colours: white, light and mid grey, cream (a scanned page's).
BORDER_COLOURS: tuple[tuple[int, int, int], ...] = (
    (255, 255, 255), (200, 200, 200), (128, 128, 128), (235, 225, 200),
)  # fmt: skip


def add_border(
    pixels: np.ndarray,
    rng: np.random.Generator,
    colours: tuple[tuple[int, int, int], ...] = BORDER_COLOURS,
) -> np.ndarray:
    """A copy of uint8 ``pixels`` [H, W, 3] with a border of one of ``colours``: a
    letterbox (6-14 % of the height top and bottom), a pillarbox (of the width, left and
    right) or a frame (4-8 % all round), drawn from ``rng`` (the border defect of the pool
    and of the artifact reward's training set)."""
    out = pixels.copy()
    h, w = out.shape[:2]
    colour = colours[int(rng.integers(len(colours)))]
    style = str(rng.choice(["letterbox", "pillarbox", "frame"]))
    f = rng.uniform(0.06, 0.14) if style != "frame" else rng.uniform(0.04, 0.08)
    bh, bw = max(2, int(h * f)), max(2, int(w * f))
    if style in ("letterbox", "frame"):
        out[:bh], out[h - bh :] = colour, colour
    if style in ("pillarbox", "frame"):
        out[:, :bw], out[:, w - bw :] = colour, colour
    return out


def _broken(rng: np.random.Generator) -> tuple[bytes, str]:
    kind = int(rng.integers(4))
    if kind == 0:
        return b"", "jpg"
    if kind == 1:
        return b"<!DOCTYPE html><html><body>403 Forbidden</body></html>\n", "png"
    if kind == 2:
        return rng.integers(0, 256, int(rng.integers(100, 5000)), dtype=np.uint8).tobytes(), "jpg"
    # A PNG signature followed by garbage.
    return b"\x89PNG\r\n\x1a\n" + rng.integers(0, 256, 512, dtype=np.uint8).tobytes(), "png"


def make_pool(
    seed: int = 0,
    n_clean: int = 100,
    n_per_defect: int = 10,
    n_overrepresented: int = 30,
    min_side: int = 320,
    max_side: int = 400,
    classes: Sequence[str] = DEFECT_CLASSES,
    n_copies: int = 0,
    copy_edits: Sequence[str] = COPY_EDITS,
) -> list[PoolItem]:
    """A raw pool: ``n_clean`` clean scenes (2–3 shapes, some with a word), then
    ``n_per_defect`` items of each defect class (``n_overrepresented`` of the over-represented
    concept; ``n_copies`` semantic duplicates, copies that hashes miss, ``shapes.copies``),
    shuffled, with clean originals always before their duplicates.

    Copy ``j`` is made by ``copy_edits[j % len(copy_edits)]``.

    Clean images have shorter side ``min_side..max_side`` px and aspect ≤ 1.5; they pass
    every default filter at the 256 stage. ``classes`` limits which defects are injected.
    """
    if n_copies and (not copy_edits or set(copy_edits) - set(COPY_EDITS)):
        raise ValueError(f"copy_edits {list(copy_edits)} must be some of {COPY_EDITS}")
    unknown = set(classes) - set(DEFECT_CLASSES)
    if unknown:
        raise ValueError(f"unknown defect classes {sorted(unknown)}; known: {DEFECT_CLASSES}")
    rng = np.random.default_rng(seed)
    seen: set = set()
    clean: list[PoolItem] = []
    clean_pixels: list[np.ndarray] = []
    for i in range(n_clean):
        scene = _clean_scene(rng, seen)
        px = render(scene, *_size(rng, min_side, max_side))
        ext = "jpg" if rng.random() < 0.7 else "png"
        clean.append(PoolItem(f"clean-{i:05d}", encode(px, ext), ext, "clean", scene=scene))
        clean_pixels.append(px)

    defects: list[PoolItem] = []

    def add(label: str, data: bytes, ext: str, **kw: object) -> None:
        defects.append(PoolItem(f"{label}-{len(defects):05d}", data, ext, label, **kw))  # type: ignore[arg-type]

    def scene_px(w_h: tuple[int, int]) -> tuple[Scene, np.ndarray]:
        scene = _clean_scene(rng, seen)
        return scene, render(scene, *w_h)

    want = set(classes)
    for _ in range(n_per_defect):
        if "broken" in want:
            add("broken", *_broken(rng))
        if "truncated" in want:
            scene, px = scene_px(_size(rng, min_side, max_side))
            full = encode(px, str(rng.choice(["jpg", "png"])))
            cut = int(len(full) * rng.uniform(0.3, 0.7))
            ext = "jpg" if full[:2] == b"\xff\xd8" else "png"
            add("truncated", full[:cut], ext, scene=scene)
        if "tiny" in want:
            scene, px = scene_px(_size(rng, 48, 160))
            add("tiny", encode(px, "png"), "png", scene=scene)
        if "extreme_aspect" in want:
            short = int(rng.integers(min_side, max_side))
            long = int(short * rng.uniform(4.0, 6.0))
            scene, px = scene_px((long, short) if rng.random() < 0.5 else (short, long))
            add("extreme_aspect", encode(px, "jpg"), "jpg", scene=scene)
        if "flat" in want:
            w, h = _size(rng, min_side, max_side)
            flat = np.empty((h, w, 3), np.uint8)
            flat[:] = rng.integers(0, 256, 3)
            add("flat", encode(flat, str(rng.choice(["jpg", "png"]))), "png")
        if "noise" in want:
            w, h = _size(rng, min_side, max_side)
            noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            if rng.random() < 0.5:  # grey noise
                noise[:] = noise[:, :, :1]
            add("noise", encode(noise, "png"), "png")
        if "border" in want:
            scene, px = scene_px(_size(rng, min_side, max_side))
            add("border", encode(add_border(px, rng), "png"), "png", scene=scene)
        if "text_dense" in want:
            scene, px = scene_px(_size(rng, min_side, max_side))
            add("text_dense", encode(_text_dense(px, rng), "png"), "png", scene=scene)
    sources = rng.choice(len(clean), size=2 * n_per_defect, replace=False)
    for i in sources[:n_per_defect] if "exact_duplicate" in classes else ():
        add("exact_duplicate", clean[i].data, clean[i].ext, source=clean[i].key)
    for j, i in enumerate(sources[n_per_defect:] if "near_duplicate" in classes else ()):
        edit = NEAR_DUPLICATE_EDITS[j % len(NEAR_DUPLICATE_EDITS)]
        data, ext = _near_duplicate(clean_pixels[i], edit, rng)
        add("near_duplicate", data, ext, source=clean[i].key, edit=edit, scene=clean[i].scene)
    for _ in range(n_overrepresented if "overrepresented" in classes else 0):
        scene = _overrepresented_scene(rng, seen)
        px = render(scene, *_size(rng, min_side, max_side))
        add("overrepresented", encode(px, "jpg"), "jpg", scene=scene)
    if n_copies:
        # Drawn after everything else, so a pool without copies is the same as before.
        for j, i in enumerate(rng.choice(len(clean), size=n_copies, replace=False)):
            edit = copy_edits[j % len(copy_edits)]
            px = copy_edit(clean_pixels[i], edit, rng)
            ext = "jpg" if rng.random() < 0.7 else "png"
            # No scene: after a flip or a crop the original's spec no longer describes it.
            add(SEMANTIC_DUPLICATE, encode(px, ext), ext, source=clean[i].key, edit=edit)

    # Shuffle, then move every original before its copies: ingest order decides ties
    # ("largest, then earliest"), so the clean original must be the earliest.
    items = clean + defects
    order = rng.permutation(len(items))
    shuffled = [items[i] for i in order]
    rank = {it.key: k for k, it in enumerate(shuffled)}
    for it in shuffled:
        if it.source is not None and rank[it.source] > rank[it.key]:
            rank[it.source], rank[it.key] = rank[it.key], rank[it.source]
    return sorted(shuffled, key=lambda it: rank[it.key])


def write_pool(items: list[PoolItem], directory: Path) -> Path:
    """Write the files (in pool order, with a ``NNNNN-`` prefix) and ``labels.jsonl`` (the
    ground truth, for evaluation only). An item with a scene gets a sidecar ``<stem>.json``
    holding ``{"scene": spec}``: what the generator drew, the metadata ingest puts in the
    row (``krea2.curate.sources``) and the ``shapes`` captioner writes captions from."""
    directory.mkdir(parents=True, exist_ok=True)
    labels = directory / "labels.jsonl"
    with labels.open("w") as f:
        for n, it in enumerate(items):
            meta = it.meta() | {"file": f"{n:05d}-{it.key}.{it.ext}"}
            image = directory / meta["file"]
            image.write_bytes(it.data)
            if it.scene is not None:
                sidecar_path(image).write_text(json.dumps({"scene": meta["scene"]}))
            f.write(json.dumps(meta) + "\n")
    return labels
