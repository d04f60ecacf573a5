"""Curate speed: decode + all cheap filters + all hashes per image, against the usual way.

Ours (``krea2.curate.image_analysis.analyze_bytes``): one decode at reduced scale (JPEG DCT
scaling), EXIF/alpha/mode handling, the ten cheap filters (numba; Canny in cv2) and md5,
phash 8/12 and colorhash on the 256-px analysis pixels. Baseline, as users write it today:
Pillow full decode → RGB, ``imagehash.phash(img, hash_size=12)``, ``imagehash.phash(img)``,
``imagehash.colorhash(img)``, md5, and the same filters in numpy on the full-size array.
Same images, same run, one core (``sched_setaffinity`` + the curate workers' own setting,
``krea2.curate.threads.single_threaded``: OpenCV and OpenBLAS on the calling thread). Times are
CPU seconds of this process (``time.process_time``, every thread included), not wall time:
the machine is shared, and other processes' load would otherwise count against whichever
side ran while it peaked.

long module: the image sets (real, ShapesWorld, four generated large classes), the baseline
and the report live together so that one file states what is measured against what.

Targets: ours ≥ 3× baseline images/s per core on every set; decode ≥ 60% of our per-image
time. Sets: the bundled real photos, ShapesWorld JPEGs, and four classes of large images
composed at run time from the real photos (``large_images``: ≥ 12 MP JPEGs, 16-bit PNGs,
5K RGBA PNGs, 5K screenshots; never committed).
Run from the root: ``uv run python -m benchmarks.curate [--repeats 3] [--shapes 60]``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import time
from pathlib import Path

import cv2
import imagehash
import numpy as np
from PIL import Image

from benchmarks.report import table, write_results
from krea2.curate.config import CurateConfig
from krea2.curate.decode import decode
from krea2.curate.filters import run_cheap_filters
from krea2.curate.filters.complexity import edge_density
from krea2.curate.hashes import colour_hash_bytes, image_hashes, phash_bytes
from krea2.curate.image_analysis import analyze_bytes, analyze_decoded, decode_limits
from krea2.curate.planes import planes
from krea2.curate.shapes import render, sample_scene
from krea2.curate.threads import single_threaded


def real_photos() -> dict[str, bytes]:
    import matplotlib
    import skimage
    import sklearn

    sk = Path(skimage.__file__).parent / "data"
    paths = [p for p in sorted(sk.iterdir()) if p.suffix in (".png", ".jpg")]
    paths += sorted((Path(sklearn.__file__).parent / "datasets" / "images").glob("*.jpg"))
    paths.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    return {p.name: p.read_bytes() for p in paths}


def shapes_images(n: int) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    out = {}
    for i in range(n):
        w, h = [(512, 512), (640, 480), (480, 640), (768, 512)][i % 4]
        buf = io.BytesIO()
        Image.fromarray(render(sample_scene(rng, word_prob=0.3), w, h)).save(
            buf, format="JPEG", quality=90
        )
        out[f"shapes-{i:03d}.jpg"] = buf.getvalue()
    return out


# -- large images, generated at run time from the real photos (never committed) ------------


def _mosaic(photos: list[np.ndarray], w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """(h, w, 3) uint8: a 2x2 mosaic of photos upscaled with Lanczos, plus sensor-like noise
    (sigma 3), so the JPEG/PNG sizes are those of a camera's, not of a smooth upscale."""
    picks = rng.choice(len(photos), 4, replace=False)
    tiles = [
        np.asarray(Image.fromarray(photos[i]).resize((w // 2, h // 2), Image.Resampling.LANCZOS))
        for i in picks
    ]
    canvas = np.vstack([np.hstack(tiles[:2]), np.hstack(tiles[2:])])
    noise = rng.normal(0.0, 3.0, canvas.shape)
    return np.clip(canvas + noise, 0, 255).astype(np.uint8)


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _screenshot(w: int, h: int, photo: np.ndarray, rng: np.random.Generator) -> Image.Image:
    """A 5K UI screenshot: a sidebar, panels, many lines of text, one embedded photo."""
    from PIL import ImageDraw, ImageFont

    img = Image.new("RGB", (w, h), (246, 246, 248))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, w // 6, h), fill=(32, 34, 40))
    font = ImageFont.load_default(size=30)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "curate",
        "shard",
        "bucket",
        "caption",
        "image",
    ]
    for y in range(60, h - 60, 44):
        line = " ".join(rng.choice(words, int(rng.integers(4, 14))))
        draw.text((w // 6 + 80, y), line, fill=(20, 20, 24), font=font)
        draw.text((40, y), str(rng.choice(words)), fill=(200, 200, 210), font=font)
    panel = Image.fromarray(photo).resize((w // 3, h // 3), Image.Resampling.LANCZOS)
    img.paste(panel, (w - w // 3 - 80, 120))
    return img


def _alpha_art(w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """(h, w, 4): white colour, the drawing (rings, strokes) only in alpha."""
    from PIL import ImageDraw

    alpha = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(alpha)
    for _ in range(40):
        x, y, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(40, 600))
        draw.ellipse((x - r, y - r, x + r, y + r), outline=int(rng.integers(120, 256)), width=24)
    rgba = np.full((h, w, 4), 255, np.uint8)
    rgba[:, :, 3] = np.asarray(alpha)
    return rgba


def large_images(photos: dict[str, bytes], per_class: int) -> dict[str, dict[str, bytes]]:
    """Four classes of large images composed from the real photos: >= 12 MP camera-like
    JPEGs, 16-bit PNGs (RGB written by OpenCV, grey by Pillow), 5K RGBA PNGs (a photo cut
    out with a soft mask, and art that lives only in the alpha channel) and 5K screenshots
    of text and UI."""
    rng = np.random.default_rng(0)
    rgb = [
        np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))
        for d in photos.values()
        if min(Image.open(io.BytesIO(d)).size) >= 256
    ]
    jpeg, png16, rgba, screens = {}, {}, {}, {}
    yy, xx = np.mgrid[0:2880, 0:5120]
    soft = np.clip(1.6 - np.hypot((xx - 2560) / 2000, (yy - 1440) / 1100), 0, 1)
    for i in range(per_class):
        buf = io.BytesIO()
        Image.fromarray(_mosaic(rgb, 4256, 2832, rng)).save(buf, format="JPEG", quality=92)
        jpeg[f"camera-{i}.jpg"] = buf.getvalue()
        deep = _mosaic(rgb, 3000, 2000, rng).astype(np.uint16) * 257
        if i % 2 == 0:
            png16[f"rgb16-{i}.png"] = cv2.imencode(".png", deep[:, :, ::-1])[1].tobytes()
        else:
            png16[f"grey16-{i}.png"] = _png(Image.fromarray(np.ascontiguousarray(deep[:, :, 1])))
        if i % 2 == 0:
            cut = np.dstack([_mosaic(rgb, 5120, 2880, rng), (soft * 255).astype(np.uint8)])
            rgba[f"cutout-{i}.png"] = _png(Image.fromarray(cut, "RGBA"))
        else:
            rgba[f"alpha-art-{i}.png"] = _png(Image.fromarray(_alpha_art(5120, 2880, rng), "RGBA"))
        screens[f"screen-{i}.png"] = _png(_screenshot(5120, 2880, rgb[i % len(rgb)], rng))
    return {
        ">= 12 MP JPEG q92 (4256x2832)": jpeg,
        "16-bit PNG, RGB and grey (3000x2000)": png16,
        "RGBA PNG 5K: photo cutout, alpha-only art": rgba,
        "5K screenshot PNG (text, UI)": screens,
    }


def baseline(data: bytes) -> dict:
    """The usual way: full decode, imagehash, numpy filters."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    a = np.asarray(img)
    grey = np.asarray(img.convert("L"), dtype=np.float64)
    lap = grey[:-2, 1:-1] + grey[2:, 1:-1] + grey[1:-1, :-2] + grey[1:-1, 2:] - 4 * grey[1:-1, 1:-1]
    hist = [np.bincount(a[:, :, c].ravel(), minlength=256) / a[:, :, 0].size for c in range(3)]
    entropy = float(np.mean([-(p[p > 0] * np.log2(p[p > 0])).sum() for p in hist]))
    median = np.median(a.reshape(-1, 3), axis=0)
    edges = cv2.Canny(grey.astype(np.uint8), 100, 200)
    return {
        "md5": hashlib.md5(data).hexdigest(),
        "phash12": str(imagehash.phash(img, hash_size=12)),
        "phash8": str(imagehash.phash(img)),
        "colorhash": str(imagehash.colorhash(img)),
        "laplacian": float(lap.var()),
        "entropy": entropy,
        "white": float((a.min(axis=2) >= 250).mean()),
        "black": float((a.max(axis=2) <= 5).mean()),
        "flat": float((np.abs(a - median).max(axis=2) <= 8).mean()),
        "border": float(np.abs(a[0].astype(int) - a[0].mean(axis=0)).max()),
        "complexity": float((edges > 0).mean()),
        "size": img.size,
    }


def per_image_seconds(fn, images: dict[str, bytes], repeats: int) -> list[float]:
    """Median over ``repeats`` of each image's CPU time."""
    out = []
    for data in images.values():
        times = []
        for _ in range(repeats):
            t = time.process_time()
            fn(data)
            times.append(time.process_time() - t)
        out.append(statistics.median(times))
    return out


def elementary_ops(pixels: dict, shared: dict) -> dict:
    """Each call of our analysis after the decode, on one image's analysis pixels (by key),
    the calls after the shared measurements given their result: where the non-decode time
    goes."""
    return {
        "shared measurements: one pixel pass + Laplacian, entropy, flat, border (compiled)": (
            lambda k: planes(pixels[k])
        ),
        "Canny edge density (OpenCV)": lambda k: edge_density(shared[k].grey),
        "phash 8 + 12: Lanczos, DCT, median (compiled)": lambda k: [
            phash_bytes(shared[k].luma, s) for s in (8, 12)
        ],
        "colorhash + hue histogram (compiled)": lambda k: colour_hash_bytes(
            shared[k].colours.counts
        ),
    }


def side_by_side(
    images: dict[str, bytes], repeats: int, cfg: CurateConfig
) -> dict[str, list[float]]:
    """Per image, the median over ``repeats`` of each series' CPU seconds, the series taking
    turns image by image and repeat by repeat (so a VM's speed drifting during the run moves
    them all alike): ``ours`` = ``analyze_bytes``, run as its two halves (``decode``, then
    ``analyze_decoded``) with a clock read between, giving ``decode`` inside our analysis;
    ``decode_alone`` = ``decode`` again right after on the same bytes (warmer caches);
    ``baseline``."""
    limits = decode_limits(cfg)
    series: dict[str, list[float]] = {k: [] for k in ("ours", "decode", "decode_alone", "baseline")}
    for data in images.values():
        runs: dict[str, list[float]] = {k: [] for k in series}
        for _ in range(repeats):
            t0 = time.process_time()
            image = decode(data, limits)
            t1 = time.process_time()
            analyze_decoded(data, image, cfg)
            t2 = time.process_time()
            decode(data, limits)
            t3 = time.process_time()
            baseline(data)
            t4 = time.process_time()
            for k, v in zip(series, (t2 - t0, t1 - t0, t3 - t2, t4 - t3), strict=True):
                runs[k].append(v)
        for k in series:
            series[k].append(statistics.median(runs[k]))
    return series


def measure(name: str, images: dict[str, bytes], repeats: int, cfg: CurateConfig) -> dict:
    limits = decode_limits(cfg)
    timed = side_by_side(images, repeats, cfg)
    ours, base = timed["ours"], timed["baseline"]
    dec_in_run, dec = timed["decode"], timed["decode_alone"]
    decoded = {k: decode(d, limits) for k, d in images.items()}
    keys = {k: k for k in images}
    t = cfg.thresholds()
    pixels = {k: im.pixels for k, im in decoded.items()}
    shared = {k: planes(px) for k, px in pixels.items()}
    plane_s = per_image_seconds(planes, pixels, repeats)
    filt = per_image_seconds(lambda k: run_cheap_filters(decoded[k], t, shared[k]), keys, repeats)
    hashes = per_image_seconds(lambda k: image_hashes(pixels[k], shared[k]), keys, repeats)
    ops = {
        op: 1000 * float(np.mean(per_image_seconds(fn, keys, repeats)))
        for op, fn in elementary_ops(pixels, shared).items()
    }
    mp = [Image.open(io.BytesIO(d)).size for d in images.values()]
    return {
        "set": name,
        "images": len(images),
        "mean_megapixels": float(np.mean([w * h / 1e6 for w, h in mp])),
        "ours_img_per_s": len(ours) / sum(ours),
        "baseline_img_per_s": len(base) / sum(base),
        "speedup": sum(base) / sum(ours),
        "decode_share": sum(dec_in_run) / sum(ours),
        "decode_alone_share": sum(dec) / sum(ours),
        "ours_ms": 1000 * sum(ours) / len(ours),
        "decode_ms": 1000 * sum(dec_in_run) / len(dec_in_run),
        "decode_alone_ms": 1000 * sum(dec) / len(dec),
        "planes_ms": 1000 * sum(plane_s) / len(plane_s),
        "filters_ms": 1000 * sum(filt) / len(filt),
        "hashes_ms": 1000 * sum(hashes) / len(hashes),
        "baseline_ms": 1000 * sum(base) / len(base),
        "ops_ms": ops,
    }


def ops_table(results: list[dict]) -> str:
    """Where our non-decode time goes, per set, and the decode share it allows at best."""
    names = list(results[0]["ops_ms"])
    rows = [[op, *(f"{r['ops_ms'][op]:.3f}" for r in results)] for op in names]
    floors = [sum(r["ops_ms"].values()) for r in results]
    rows.append(["**sum of the steps**", *(f"**{f:.3f}**" for f in floors)])
    rows.append(["decode (inside the analysis)", *(f"{r['decode_ms']:.3f}" for r in results)])
    rows.append(["ours, whole analysis", *(f"{r['ours_ms']:.3f}" for r in results)])
    best = [r["decode_ms"] / (r["decode_ms"] + f) for r, f in zip(results, floors, strict=True)]
    rows.append(["decode share if only the steps remained", *(f"{b:.0%}" for b in best)])
    return (
        "Where the non-decode time goes (ms per image, each step timed alone on the analysis "
        "pixels, the steps after the shared measurements given their result; the rest of the whole "
        "analysis is md5, Python glue and the cache misses of running after a decode):\n\n"
        + table(["step", *(r["set"] for r in results)], rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", type=int, default=60, help="ShapesWorld JPEGs to time")
    parser.add_argument("--large", type=int, default=4, help="images per large-image class")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    single_threaded()  # the workers' setting: OpenCV and BLAS on the calling thread
    cfg = CurateConfig()
    photos = real_photos()
    sets = {
        "real photos (skimage, sklearn, matplotlib)": photos,
        "ShapesWorld JPEG q90, 512-768 px": shapes_images(args.shapes),
        **(large_images(photos, args.large) if args.large else {}),
    }
    for images in sets.values():  # warm caches and lazy imports
        for d in list(images.values())[:3]:
            analyze_bytes(d, cfg), baseline(d)
    results = [measure(name, images, args.repeats, cfg) for name, images in sets.items()]
    rows = [
        [
            r["set"],
            r["images"],
            f"{r['mean_megapixels']:.2f}",
            f"{r['baseline_img_per_s']:.0f}",
            f"{r['ours_img_per_s']:.0f}",
            f"**{r['speedup']:.2f}×** (target ≥ 3×)",
            f"{r['decode_share']:.0%} (target ≥ 60%)",
            f"{r['decode_alone_share']:.0%}",
            f"{r['decode_ms']:.2f} ({r['decode_alone_ms']:.2f}) / {r['planes_ms']:.2f} / "
            f"{r['filters_ms']:.2f} / {r['hashes_ms']:.2f}",
        ]
        for r in results
    ]
    md = (
        "## Curate: decode + cheap filters + hashes (`benchmarks/curate.py`)\n\n"
        "Images per CPU-second on one core. Baseline = Pillow full decode, "
        "`imagehash.phash(hash_size=12)`, "
        "`imagehash.phash`, `imagehash.colorhash`, md5 and numpy filters on the full image; "
        "ours = one reduced-scale decode, then one compiled call for the shared measurements "
        "(a pass over the pixels for grey, Pillow luma, channel histograms, colour-class and "
        "white/black counts, row/column sums; the Laplacian, entropy, flat-colour and border "
        "scores; `krea2.curate.planes`, numba), OpenCV's Canny, and one compiled call per hash "
        "(bit-identical to imagehash), on the 256-px analysis pixels. "
        f"Median of {args.repeats} per image (CPU time of the process); ours, the decode "
        "alone and the baseline take turns image by image and repeat by repeat. "
        "Decode share: the decode's part of our whole analysis, both timed in the same "
        "runs (`analyze_bytes` as its two halves, `decode` and `analyze_decoded`); the decode "
        "timed alone, again right after on the same bytes, runs with warmer caches than "
        "inside the analysis and is shown for reference. "
        "Bit-identity with imagehash is kept without Pillow's resize and HSV loops: the Lanczos "
        "passes are Pillow's own fixed-point weights and integer arithmetic, compiled, and the "
        "colour "
        "classes come from a table of every 24-bit colour built once by Pillow's and OpenCV's "
        "conversions. The large-image classes are composed at run time from the real photos "
        "(`large_images`: 2x2 mosaics upscaled with Lanczos plus sensor-like noise; 16-bit "
        "RGB by OpenCV and grey by Pillow; RGBA: a photo cut out with a soft mask, and white "
        "art drawn only in alpha; screenshots: text lines, a sidebar and a photo panel).\n\n"
        + table(
            [
                "images",
                "n",
                "mean MP",
                "baseline img/s",
                "ours img/s",
                "speedup",
                "decode share of ours",
                "same, decode timed alone",
                "ours ms: decode (alone) / shared measurements / filters / hashes",
            ],
            rows,
        )
    )
    md += "\n\n" + ops_table(results)
    write_results("curate", {"results": results, "repeats": args.repeats}, md)
    print(md)


if __name__ == "__main__":
    main()
