"""The demo's last stage: ``report.html`` (self-contained) and ``summary.json`` from the
stage results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from krea2.pipeline import curation, html, preference


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
        ("Embedding-level curation", curation.embedding_section(curate)),
        ("Example rejects", examples or '<p class="note">none</p>'),
        ("Duplicate groups (keeper first)", groups or '<p class="note">none</p>'),
    ]


def upscale(image: np.ndarray, side: int = 128) -> np.ndarray:
    """uint8 [H, W, 3] repeated by whole pixels up to about ``side`` (unchanged if larger)."""
    k = max(1, side // image.shape[0])
    return np.kron(image, np.ones((k, k, 1), np.uint8)) if k > 1 else image


def sample_section(name: str, images: np.ndarray, scores: dict) -> str:
    items = []
    for p, prompt in enumerate(scores["prompts"]):
        for s in range(images.shape[1]):
            score = scores["per_image"][p][s]
            items.append((html.png_data_uri(upscale(images[p, s])), f"{prompt} — {score:.2f}"))
    return f"<h3>{html.escape(name)}</h3>" + html.image_grid(items)


def preference_section(results: dict[str, dict], prompts: list[str]) -> str:
    """The preference stages (``{objective: preference_stage result}``, STPO first) against
    the pretrained model: the comparison table, the winner's and loser's likelihood gaps
    per logged step, and the first seed's samples on up to 8 of the held-out ``prompts``.
    An objective that had no pair shows its note instead."""
    parts = [html.table(preference.HEADERS, preference.comparison_rows(results))]
    pairs = next(iter(results.values()))["pairs"]
    trained = (
        f"{pairs} on-policy pairs from the SFT model (k-th best vs k-th worst sample of a "
        "training-concept prompt by the rubric, ties left out); each objective trained "
        "from the same start on them and measured on the held-out prompts. "
        if pairs
        else ""
    )
    parts.append(
        f'<p class="note">{trained}Artifact reward: 1 − P(defect), higher is cleaner. HF '
        "energy: high-frequency energy of the samples relative to the pretrained model's "
        "(> 1: more fine texture, e.g. a grid pattern). Gaps: e − e_ref, the per-pixel "
        "velocity MSE against the frozen pretrained model (> 0: that image's likelihood "
        "fell); STPO's winner hinge is built to keep the winner's at or below 0, DPO's "
        "loss only asks the loser's to exceed it.</p>"
    )
    for kind, r in results.items():
        if note := r.get("note"):
            parts.append(f'<p class="warning">{html.escape(kind.upper())}: {html.escape(note)}</p>')
    series = {}
    for kind, r in results.items():
        if preference.gap_stats(r) is None:
            continue
        c = r["curves"]
        for side in ("winner", "loser"):
            series[f"{kind.upper()} {side} gap"] = list(
                zip(c["step"], c[f"{side}_gap"], strict=True)
            )
    if series:
        parts.append(
            "<h3>Likelihood gaps during training</h3>"
            + html.line_chart(series, x_label="step", y_label="e − e_ref", log=False)
        )
    rows = preference.first_seed_rows(results)
    n = len(rows[0][1])
    parts.append(
        "<h3>Held-out prompts, first seed</h3>"
        + html.image_table(
            prompts[:n],
            [(label, [html.png_data_uri(upscale(im)) for im in ims]) for label, ims in rows],
        )
    )
    return "".join(parts)


def _forced(e: dict) -> str:
    forced = e.get("shapes_eval_forced")
    return "" if forced is None else f"{forced:.3f}"


def score_sections(evals: dict[str, dict], samples: Path) -> list[tuple[str, str]]:
    """The ShapesEval table of the ``score`` stage (name -> its evaluation) and the sample
    grids (``samples/NAME.npy``) with each image's verifier score."""
    kinds = sorted({k for e in evals.values() for k in e["by_kind"]})
    rows = [
        [name, f"{e['shapes_eval']:.3f}", _forced(e), f"{e['all_correct']:.3f}",
         *(f"{e['by_kind'].get(k, float('nan')):.3f}" for k in kinds)]
        for name, e in evals.items()
    ]  # fmt: skip
    headers = ["model", "ShapesEval", "forced choice", "all requirements", *kinds]
    table = html.table(headers, rows) + (
        '<p class="note">ShapesEval: mean share of a prompt\'s requirements that the rubric '
        "verifier finds in the image (colour+shape, position, counts), over held-out "
        "(colour, shape, position) combinations never seen together in training. An object "
        "whose best shape template wins by less than a calibrated margin is unclear and "
        "meets no shape requirement; forced choice: the score before that verdict (each "
        "object read as its best shape), shown beside the new one for one release.</p>"
    )
    grids = "".join(
        sample_section(name, np.load(samples / f"{name}.npy"), e) for name, e in evals.items()
    )
    return [
        ("ShapesEval on held-out prompts", table),
        ("Samples (held-out prompts, fixed seeds; verifier score per image)", grids),
    ]
