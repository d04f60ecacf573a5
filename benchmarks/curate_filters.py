"""Cheap filters calibrated on real photos: false rejects of good photographs, defect recall.

Good photos: the 19 real photographs of the near-duplicate benchmark (scikit-image,
scikit-learn, matplotlib wheels), each as itself and as ``--variants`` random takes the way
photos arrive (a crop keeping 50-100 % of each side, rescaled 0.7-1.3x with the shorter side
kept >= 256 px, JPEG q70-95 / PNG / WebP, a third with Gaussian sensor noise sigma 2-8), plus
``--mosaics`` dense-detail images: 3x3 tiles of the most detailed photos (grass, gravel,
brick, foliage) at 1152 px, which the analysis reduces 4.5x, as a 20+ MP photo of foliage
or rocks is. Defects: the ShapesWorld injector's classes that the cheap filters catch, and
noise images of every size from 256 to 3000 px (the injector draws 320-400 px only).

Each image is decoded and measured once; every filter is then judged under the thresholds
before the calibration (no noise filter, Laplacian <= 5000, edge density <= 0.30) and the
current defaults. A photo counts against every filter that fails it, not only the first.

    uv run python -m benchmarks.curate_filters            # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import io
from dataclasses import replace

import numpy as np
from PIL import Image

from benchmarks.near_dups import real_photos
from benchmarks.report import table, write_results
from krea2.curate.config import CurateConfig, StageThresholds
from krea2.curate.decode import DecodeError, decode
from krea2.curate.evaluate import DEFECT_REASONS
from krea2.curate.filters import CHEAP_FILTERS, run_cheap_filters
from krea2.curate.planes import planes
from krea2.curate.shapes import make_pool

DETAILED = ("grass.png", "gravel.png", "brick.png", "china.jpg", "coffee.png", "ihc.png")
DEFECTS = ("tiny", "extreme_aspect", "flat", "noise", "border")


def before_calibration(t: StageThresholds) -> StageThresholds:
    """The 256 stage's thresholds as they were before this benchmark set them."""
    return replace(t, min_neighbour_corr=-1.0, max_laplacian_var=5000.0, max_complexity=0.30)


def _encode(px: np.ndarray, rng: np.random.Generator) -> bytes:
    buf = io.BytesIO()
    img = Image.fromarray(px)
    u = rng.random()
    if u < 0.6:
        img.save(buf, format="JPEG", quality=int(rng.integers(70, 96)))
    elif u < 0.8:
        img.save(buf, format="PNG")
    else:
        img.save(buf, format="WEBP", quality=80)
    return buf.getvalue()


def good_photos(variants: int, mosaics: int, seed: int) -> list[tuple[str, bytes]]:
    """(photo name, encoded bytes) of every good photo described in the module docstring."""
    rng = np.random.default_rng(seed)
    photos = real_photos()
    arrays = {n: np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for n, d in photos.items()}
    out = list(photos.items())
    for name, im in arrays.items():
        h, w = im.shape[:2]
        for _ in range(variants):
            ch, cw = int(h * rng.uniform(0.5, 1.0)), int(w * rng.uniform(0.5, 1.0))
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            scale = max(256 / min(ch, cw), rng.uniform(0.7, 1.3))
            size = (max(256, round(cw * scale)), max(256, round(ch * scale)))
            take = Image.fromarray(im[y : y + ch, x : x + cw]).resize(size, Image.LANCZOS)
            px = np.asarray(take, np.float64)
            if rng.random() < 1 / 3:
                px = px + rng.normal(0.0, rng.uniform(2.0, 8.0), px.shape)
            out.append((name, _encode(np.clip(px, 0, 255).astype(np.uint8), rng)))
    detailed = [arrays[n] for n in DETAILED]
    for _ in range(mosaics):
        rows = []
        for _r in range(3):
            tiles = []
            for _c in range(3):
                im = detailed[int(rng.integers(len(detailed)))]
                y = int(rng.integers(0, im.shape[0] - 384 + 1))
                x = int(rng.integers(0, im.shape[1] - 384 + 1))
                tiles.append(im[y : y + 384, x : x + 384])
            rows.append(np.concatenate(tiles, 1))
        out.append(("detail mosaic", _encode(np.concatenate(rows, 0), rng)))
    return out


def noise_any_size(n: int, seed: int) -> list[bytes]:
    """``n`` PNG noise images (uniform 0-255, half grey) with sides 256-3000 px."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = (int(v) for v in rng.integers(256, 3001, 2))
        px = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if i % 2:
            px[:] = px[:, :, :1]
        buf = io.BytesIO()
        Image.fromarray(px).save(buf, format="PNG", compress_level=1)
        out.append(buf.getvalue())
    return out


def verdicts(
    data: bytes, settings: dict[str, StageThresholds]
) -> tuple[dict[str, dict[str, bool]], float | None]:
    """Per threshold setting, each cheap filter's pass (True) or fail, and the neighbour
    correlation (None for a broken file), all on one decode."""
    try:
        image = decode(data, CurateConfig().decode)
    except DecodeError:
        return {k: {"broken": False} for k in settings}, None
    shared = planes(image.pixels)
    passed = {
        k: {r.name: r.passed for r in run_cheap_filters(image, t, shared)}
        for k, t in settings.items()
    }
    return passed, shared.neighbour_corr


def false_rejects(photos: list[tuple[str, bytes]], settings) -> dict:
    fails = {k: {f: 0 for f in CHEAP_FILTERS} for k in settings}
    rejected = {k: 0 for k in settings}
    names: dict[str, dict[str, int]] = {k: {} for k in settings}
    corr = []
    for name, data in photos:
        by_setting, c = verdicts(data, settings)
        corr += [c] if c is not None else []
        for k, passed in by_setting.items():
            failed = [f for f, ok in passed.items() if not ok]
            for f in failed:
                fails[k][f] = fails[k].get(f, 0) + 1
            if failed:
                rejected[k] += 1
                names[k][name] = names[k].get(name, 0) + 1
    n = len(photos)
    by = {
        k: {
            "n": n,
            "rejected": rejected[k],
            "rejected_share": rejected[k] / n,
            "per_filter": {f: c / n for f, c in fails[k].items()},
            "rejected_by_photo": names[k],
        }
        for k in settings
    }
    return by, np.array(corr)


def defect_recall(items: list[tuple[str, bytes]], settings) -> tuple[dict, float]:
    """Per setting and defect class: the share caught by that class's reject reasons (any
    of them failing counts; ``DEFECT_REASONS``); and the noise defects' largest neighbour
    correlation."""
    caught = {k: {} for k in settings}
    support: dict[str, int] = {}
    noise_corr = -1.0
    for label, data in items:
        support[label] = support.get(label, 0) + 1
        by_setting, c = verdicts(data, settings)
        if label.startswith("noise") and c is not None:
            noise_corr = max(noise_corr, c)
        for k, passed in by_setting.items():
            reasons = DEFECT_REASONS[label.split(" ")[0]]
            hit = any(not ok for f, ok in passed.items() if f in reasons)
            caught[k][label] = caught[k].get(label, 0) + hit
    recall = {k: {c: caught[k].get(c, 0) / s for c, s in support.items()} for k in settings}
    return recall, noise_corr


def markdown(r: dict) -> str:
    fr, settings = r["false_rejects"], list(r["false_rejects"])
    rows = [
        [f, *(f"{100 * fr[k]['per_filter'].get(f, 0):.2f} %" for k in settings)]
        for f in CHEAP_FILTERS
    ]
    share = [f"**{100 * fr[k]['rejected_share']:.2f} %**" for k in settings]
    rows.append(["**any filter**", *share])
    rec = r["defect_recall"]
    labels = list(rec[settings[0]])
    rrows = [[c, *(f"{rec[k][c]:.3f}" for k in settings)] for c in labels]
    after = fr[settings[-1]]["rejected_by_photo"]
    return "\n".join(
        [
            "## Cheap filters on real photos (`benchmarks/curate_filters.py`)",
            "",
            f"{fr[settings[0]]['n']} good photos (the 19 real photographs, "
            f"{r['variants']} random takes of each: crops keeping 50-100 % of each side, "
            "rescaled 0.7-1.3x with the shorter side >= 256 px, JPEG q70-95 / PNG / WebP, a "
            "third with Gaussian sensor noise sigma 2-8; and "
            f"{r['mosaics']} dense-detail mosaics of grass, gravel, brick and foliage at 1152 px, "
            "reduced 4.5x by the analysis as a 20+ MP photo is). Share of them each filter "
            "rejects, a photo counting against every filter that fails it. `before`: the 256 "
            "stage's thresholds before this calibration (no noise filter, Laplacian <= 5000, "
            "edge density <= 0.30); `now`: the defaults (noise: neighbour correlation >= "
            f"{r['now']['min_neighbour_corr']}, Laplacian <= {r['now']['max_laplacian_var']:g}, "
            f"edge density <= {r['now']['max_complexity']}). Target: <= 0.5 % rejected.",
            "",
            table(["filter", *settings], rows),
            "",
            "Rejected photos by source, `now`: "
            + (", ".join(f"{k} {v}" for k, v in after.items()) or "none")
            + ". Neighbour correlation of the good photos: min "
            f"{r['photo_corr']['min']:.3f}, 1st percentile {r['photo_corr']['p1']:.3f}; of the "
            f"noise defects (both sets): max {r['noise_corr_max']:.3f}.",
            "",
            "Defect recall (share caught by the class's reject reasons), ShapesWorld injector "
            f"({r['per_defect']} per class, 320-400 px) and noise images of 256-3000 px:",
            "",
            table(["defect", *settings], rrows),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", type=int, default=32, help="random takes per photo")
    ap.add_argument("--mosaics", type=int, default=64, help="dense-detail mosaics")
    ap.add_argument("--per-defect", type=int, default=40, help="injected items per class")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-write", action="store_true", help="print, do not write results")
    args = ap.parse_args()

    now = CurateConfig().thresholds()
    settings = {"before": before_calibration(now), "now": now}
    photos = good_photos(args.variants, args.mosaics, args.seed)
    pool = make_pool(
        seed=args.seed, n_clean=2 * args.per_defect, n_per_defect=args.per_defect, classes=DEFECTS
    )
    items = [(p.label, p.data) for p in pool if p.label != "clean"]
    noise = noise_any_size(args.per_defect, args.seed)
    items += [("noise 256-3000 px", d) for d in noise]

    rejects, photo_corr = false_rejects(photos, settings)
    recall, noise_corr = defect_recall(items, settings)
    results = {
        "variants": args.variants,
        "mosaics": args.mosaics,
        "per_defect": args.per_defect,
        "seed": args.seed,
        "now": {
            "min_neighbour_corr": now.min_neighbour_corr,
            "max_laplacian_var": now.max_laplacian_var,
            "max_complexity": now.max_complexity,
        },
        "false_rejects": rejects,
        "defect_recall": recall,
        "photo_corr": {"min": float(photo_corr.min()), "p1": float(np.percentile(photo_corr, 1))},
        "noise_corr_max": noise_corr,
    }
    md = markdown(results)
    print(md)
    if not args.no_write:
        write_results("curate_filters", results, md)


if __name__ == "__main__":
    main()
