"""Demo stage 8: ``report.html`` (self-contained) and ``summary.json`` from the stage results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from krea2.pipeline import html


def thumb(path: Path, side: int = 128) -> str:
    """A data URI thumbnail of an image file, or of a grey square if it does not decode."""
    try:
        with Image.open(path) as im:
            im.draft("RGB", (side, side))
            im = im.convert("RGB")
            im.thumbnail((side, side))
            return html.png_data_uri(np.asarray(im))
    except Exception:  # broken files are part of the pool on purpose
        return html.png_data_uri(np.full((side, side, 3), 200, np.uint8))


def curation_sections(curate: dict, pool_dir: Path) -> list[tuple[str, str]]:
    counts = curate["counts"]
    funnel = html.table(["outcome", "images"], [[k, v] for k, v in counts.items()])
    pr_rows = [
        [cls, int(m["support"]), int(m["flagged"]), f"{m['precision']:.3f}", f"{m['recall']:.3f}"]
        for cls, m in curate["precision_recall"].items()
    ]
    pr = html.table(["injected defect", "images", "flagged", "precision", "recall"], pr_rows)
    kept = f'<p class="note">clean images kept: {curate["clean_kept"]:.3f}</p>'
    one_object = curate.get("one_object_truth") or {}
    if one_object:
        rows = [
            [label, sum(c.values()), ", ".join(f"{k} {v}" for k, v in c.items())]
            for label, c in one_object.items()
        ]
        kept += (
            '<p class="note">one-object renders beyond each concept\'s first, by the '
            "generator's label (re-renders nudged under a pixel are near duplicates, or exact "
            "ones where the bytes came out equal; later takes are variants, with no ground "
            "truth), scored apart from the table above:</p>"
            + html.table(["generator label", "images", "curation outcome"], rows)
        )
    examples = "".join(
        f"<h3>{html.escape(reason)}</h3>"
        + html.image_grid([(thumb(pool_dir / f), f) for f in files])
        for reason, files in curate["examples"].items()
    )
    groups = "".join(
        html.image_grid(
            [
                (thumb(pool_dir / f), ("kept: " if i == 0 else "dropped: ") + f)
                for i, f in enumerate(g)
            ]
        )
        for g in curate["duplicate_groups"]
    )
    return [
        ("Curation funnel", funnel + kept),
        ("Precision and recall against the injected labels", pr),
        ("Example rejects", examples or '<p class="note">none</p>'),
        ("Duplicate groups (keeper first)", groups or '<p class="note">none</p>'),
    ]


def sample_section(name: str, images: np.ndarray, scores: dict) -> str:
    items = []
    for p, prompt in enumerate(scores["prompts"]):
        for s in range(images.shape[1]):
            score = scores["per_image"][p][s]
            big = (
                np.kron(
                    images[p, s],
                    np.ones((128 // images.shape[2], 128 // images.shape[3], 1), np.uint8),
                )
                if images.shape[2] < 128
                else images[p, s]
            )
            items.append((html.png_data_uri(big), f"{prompt} — {score:.2f}"))
    return f"<h3>{html.escape(name)}</h3>" + html.image_grid(items)


def write_report(
    out: Path, results: dict, timings: list[tuple[str, float]], note: str | None = None
) -> dict:
    """Write ``out/report.html`` and ``out/summary.json``; returns the summary.

    ``note`` (a smoke run's warning) goes at the top of both."""
    pool_dir = out / "pool"
    evals = results["score"]
    kinds = sorted({k for e in evals.values() for k in e["by_kind"]})
    eval_rows = [
        [
            name,
            f"{e['shapes_eval']:.3f}",
            f"{e['all_correct']:.3f}",
            *(f"{e['by_kind'].get(k, float('nan')):.3f}" for k in kinds),
        ]
        for name, e in evals.items()
    ]
    summary = {
        **({"note": note} if note else {}),
        "stages": {name: round(sec, 1) for name, sec in timings},
        "pool": results["pool"],
        "curation": {k: v for k, v in results["curate"].items() if k not in ("examples",)},
        "export": results["export"],
        "shapes_eval": {
            name: {k: v for k, v in e.items() if k != "per_image"} for name, e in evals.items()
        },
    }
    sections = curation_sections(results["curate"], pool_dir)
    sections.append(
        (
            "Training loss per stage",
            html.line_chart(
                {k: v for k, v in results["pretrain"]["curves"].items()},
                x_label="step",
                y_label="loss",
            ),
        )
    )
    sections.append(
        (
            "ShapesEval on held-out prompts",
            html.table(["model", "ShapesEval", "all requirements", *kinds], eval_rows)
            + '<p class="note">ShapesEval: mean share of a prompt\'s requirements that the rubric '
            "verifier finds in the image (colour+shape, position, counts), over held-out "
            "(colour, shape, position) combinations never seen together in training.</p>",
        )
    )
    grids = "".join(
        sample_section(name, np.load(out / "samples" / f"{name}.npy"), e)
        for name, e in evals.items()
    )
    sections.append(("Samples (held-out prompts, fixed seeds; verifier score per image)", grids))
    timing = html.table(["stage", "seconds"], [[n, f"{s:.1f}"] for n, s in timings])
    sections.append(("Stage times", timing))
    intro = (
        '<p class="note">The Krea 2 pipeline at toy scale: a defect-laden ShapesWorld pool '
        "curated by krablet workers on embedded PostgreSQL shards, exported as Parquet shards at "
        "two resolutions, a tiny single-stream DiT pretrained on them, then scored with the "
        "rubric verifier.</p>"
    )
    if note:
        intro = f'<p class="warning">{html.escape(note)}</p>' + intro
    (out / "report.html").write_text(html.page("krea2 demo report", sections, intro))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
