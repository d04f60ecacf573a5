"""The demo's last stage: ``report.html`` (self-contained) and ``summary.json`` from the
stage results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from krea2.pipeline import chain, curation, html, preference


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
        f"{pairs} on-policy pairs from the final pretrained model (best vs worst sample of a "
        "training-concept prompt by rubric + 0.5 x artifact reward); each objective trained "
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
        **({"chain": chain.summary(results["chain"])} if results.get("chain") else {}),
        "stages": {name: round(sec, 1) for name, sec in timings},
        "pool": results["pool"],
        "curation": {k: v for k, v in results["curate"].items() if k not in ("examples",)},
        "export": results["export"],
        "shapes_eval": {
            name: {k: v for k, v in e.items() if k != "per_image"} for name, e in evals.items()
        },
    }
    if tuned := results.get("preference"):
        summary["preference"] = preference.summary(tuned)
    sections = []
    if results.get("chain"):
        sections.append(("The chain: pretrained → SFT → PO → RL (raw)",
                         chain.report_section(results["chain"])))  # fmt: skip
    sections += curation_sections(results["curate"], pool_dir)
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
    if merged := results.get("sft_merge"):
        from krea2.pipeline import sft_merge

        summary["sft_merge"] = sft_merge.summary(merged)
        section = sft_merge.report_section(merged, smoke=note is not None)
        sections.append(("Domain SFT and merging", section))
    if tuned:
        prompts = next(iter(evals.values()))["prompts"]
        sections.append(("Preference optimization", preference_section(tuned, prompts)))
    if rl := results.get("rl"):
        from krea2.pipeline import rl_stage

        summary["rl"] = rl_stage.summary(rl)
        prompts = next(iter(evals.values()))["prompts"]
        sections.append(("RL without CFG", rl_stage.report_section(rl, prompts, upscale)))
    if expanded := results.get("expander"):
        from krea2.pipeline import expander_stage

        summary["expander"] = expander_stage.summary(expanded)
        sections.append(("Prompt expander", expander_stage.report_section(expanded, upscale)))
    timing = html.table(["stage", "seconds"], [[n, f"{s:.1f}"] for n, s in timings])
    sections.append(("Stage times", timing))
    intro = (
        '<p class="note">The Krea 2 pipeline at toy scale: a defect-laden ShapesWorld pool '
        "curated by krablet workers on embedded PostgreSQL shards, exported as Parquet shards at "
        "two resolutions, a tiny single-stream DiT pretrained on them and scored with the rubric "
        "verifier, then post-trained in one chain — domain SFTs merged, STPO on on-policy "
        "pairs, RL without CFG — into the final model (raw), with the prompt expander in "
        "front of it; the ablations (Diffusion-DPO, the other merges) branch off the chain "
        "model they ablate.</p>"
    )
    if note:
        intro = f'<p class="warning">{html.escape(note)}</p>' + intro
    (out / "report.html").write_text(html.page("krea2 demo report", sections, intro))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
