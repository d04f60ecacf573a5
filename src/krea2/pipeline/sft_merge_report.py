"""The ``sft-merge`` stage on report.html: its table (style shares and ShapesEval per model)
and the first seed's samples on both domains' style prompts
(:mod:`krea2.pipeline.sft_merge` trains and measures them)."""

from __future__ import annotations

import numpy as np

from krea2.pipeline.sft_merge import DOMAINS

HEADERS = ["model", "style A: maroon on circles", "style B: teal on squares",
           "ShapesEval (vs base ± s.e.)"]  # fmt: skip


def rows(result: dict) -> list[list[str]]:
    """Table rows of :data:`HEADERS`, one per model."""
    out = []
    for name, m in result["models"].items():
        delta = ""
        if "shapes_eval_delta" in m and name != "base":
            delta = f" ({m['shapes_eval_delta']:+.3f} ± {m['shapes_eval_delta_se']:.3f})"
        out.append([name, f"{m['style_A']:.2f}", f"{m['style_B']:.2f}",
                    f"{m['shapes_eval']:.3f}{delta}"])  # fmt: skip
    return out


def report_section(result: dict, smoke: bool = False) -> str:
    """HTML: the table of :data:`HEADERS`, what it measures, and the first seed's samples
    of each model on both domains' style prompts (up to 4 each)."""
    from krea2.pipeline import html

    s = result["settings"]
    parts = [
        html.table(HEADERS, rows(result)),
        f'<p class="note">Two LoRA (rank {s["rank"]}) SFTs of the final pretrained model, '
        f"{s['steps']} steps each: domain A owns the circles and draws them on maroon, "
        "domain B the squares on teal (colours the world never draws); each set also "
        "replays the base's black / dark gray scenes of every concept it does not own, so "
        "an SFT changes its own content only. Style columns: share of samples whose "
        "background (median pixel, nearest named colour) is the domain's style, on content "
        "prompts (no background named) of that domain's concepts. ShapesEval on the "
        "held-out prompts (every shape, black background); in brackets its difference "
        "to the base on the same prompts and seeds, ± its standard error. A generalist "
        "merge keeps both styles and ShapesEval. Averaging (uniform, weighted) scales each "
        "domain's change down to its weight; TIES keeps each entry's dominant sign and "
        "averages only agreeing entries; task arithmetic adds both changes in full.</p>",
    ]
    if smoke:
        parts.append(
            f'<p class="warning">Smoke run: {s["steps"]} SFT steps per domain cannot move a '
            "style; this checks that the stage runs and reports.</p>"
        )
    columns = [p for d in DOMAINS for p in result["prompts"][d][:4]]
    grid = []
    for name, path in result["samples"].items():
        imgs = np.load(path)  # [domains, prompts, H, W, 3]
        uris = [html.png_data_uri(_enlarge(im)) for d in range(imgs.shape[0]) for im in imgs[d, :4]]
        grid.append((name, uris))
    parts.append("<h3>Style prompts, first seed</h3>" + html.image_table(columns, grid))
    return "".join(parts)


def _enlarge(image: np.ndarray, side: int = 96) -> np.ndarray:
    """uint8 [H, W, 3] repeated by whole pixels up to about ``side``."""
    k = max(1, side // image.shape[0])
    return np.kron(image, np.ones((k, k, 1), np.uint8))
