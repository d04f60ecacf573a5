"""The style stage on summary.json, report.html and the console: the variants' table, the
strength sweep and mixing curves, the checks, and references beside each variant's outputs
(:mod:`krea2.pipeline.style_stage` measures them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HEADERS = ["variant", "style similarity", "kind", "colour", "toy CSD", "leaked",
           "layout IoU − chance", "ShapesEval", "Δ ShapesEval vs none"]  # fmt: skip
NAMES = {"none": "raw, no reference", "R": "R: reconstruction", "S": "S: self-supervised",
         "O": "O: oracle pairs", "S+PO": "S after STPO (style − leakage pairs)"}  # fmt: skip


def _variants(result: dict) -> list[str]:
    return [k for k in NAMES if k in result]


def rows(result: dict) -> list[list[str]]:
    """Rows of :data:`HEADERS`, one per variant (raw without a reference first)."""
    out = []
    for key in _variants(result):
        m = result[key]["mean"]
        d = result[key].get("vs_none", {}).get("content")
        delta = "" if d is None else f"{d['delta']:+.3f} ± {d['se']:.3f}"
        parts = [f"{m[k]:.3f}" if k in m else "" for k in ("kind", "colour")]
        out.append([NAMES[key], f"{m['similarity']:.3f}", *parts, f"{m['csd']:.3f}",
                    f"{m['leaked']:.1%}", f"{m['layout']:+.3f}", f"{m['content']:.3f}",
                    delta])  # fmt: skip
    return out


def summary(result: dict) -> dict:
    """summary.json's ``style``: the means and paired differences per variant, the strength
    sweep, the mixing, the checks and the seconds (per-image lists left out)."""
    out = {k: {f: v for f, v in result[k].items() if f != "per_image"} for k in _variants(result)}
    for key in ("strength", "mixing", "checks", "seconds", "settings"):
        if key in result:
            out[key] = result[key]
    return out


def summary_lines(result: dict) -> list[str]:
    """The console's closing lines: each variant's style and leakage, then each check."""
    lines = []
    for key in _variants(result):
        m = result[key]["mean"]
        lines.append(f"style: {NAMES[key]}: similarity {m['similarity']:.3f}, leaked "
                     f"{m['leaked']:.1%}, ShapesEval {m['content']:.3f}")  # fmt: skip
    for name, c in result.get("checks", {}).items():
        shown = ", ".join(f"{k} {v:.3f}" for k, v in c.items()
                          if k != "holds" and isinstance(v, float))  # fmt: skip
        lines.append(f"style: {name} {'holds' if c['holds'] else 'does NOT hold'} ({shown})")
    return lines


def report_section(result: dict, upscale) -> str:  # type: ignore[no-untyped-def]
    """The style stage on report.html (module docstring)."""
    from krea2.pipeline import html

    parts = [html.table(HEADERS, rows(result))]
    st = result.get("settings", {})
    parts.append(
        f'<p class="note">Each variant trains a style module on the frozen raw model for '
        f"{st.get('steps')} steps of {st.get('batch_size')} styled one-object scenes, captioned "
        f"by content alone; only what it sees as the reference differs. Measured on "
        f"{len(result.get('prompts', []))} held-out prompts x held-out references (styles "
        f"from another seed, objects the prompt does not name), raw sampled without CFG. "
        f"Style similarity against the reference (0-1): the mean of kind (the background "
        f"kind read the same, 0/1) and colour (exp(−RGB distance / 40) of the backgrounds); "
        f"toy CSD: cosine of a contrastive style encoder's embeddings; leaked: outputs showing "
        f"an object of the reference; Δ ± the paired standard error over the prompts.</p>"
    )
    if "S+PO" in result and "vs_S" in result["S+PO"]:
        d, info = result["S+PO"]["vs_S"], result["S+PO"].get("pairs", {})
        deltas = ", ".join(f"{k} {d[k]['delta']:+.3f} ± {d[k]['se']:.3f}"
                           for k in ("similarity", "kind", "colour", "csd", "leaked", "content")
                           if k in d)  # fmt: skip
        parts.append(
            f'<p class="note">S after STPO: S sampled {info.get("pairs", "?")} pairs on training '
            "prompts x fresh-style references, ranked by style similarity − leakage with "
            "ShapesEval held; STPO trained the module alone (raw frozen, S the reference "
            f"policy). Against S on the held-out cases (content: ShapesEval): {deltas}.</p>"
        )
    checks = "".join(
        f"<li>{html.escape(name)}: {'holds' if c['holds'] else 'does not hold'} "
        f"({html.escape(', '.join(f'{k} {v:.3f}' for k, v in c.items() if isinstance(v, float)))})"
        "</li>"
        for name, c in result.get("checks", {}).items()
    )
    parts.append(f"<ul>{checks}</ul>")
    curves = {}
    if "strength" in result:
        sw = result["strength"]["sweep"]
        curves["S: similarity against strength s"] = [(float(k), v["similarity"])
                                                       for k, v in sw.items()]  # fmt: skip
    if "mixing" in result:
        mx = result["mixing"]["by_alpha"]
        curves["S: sim(A) − sim(B) against α (A at α, B at 1 − α)"] = [
            (float(k), v["toward_a"]) for k, v in mx.items()
        ]
    if curves:
        parts.append("<h3>Strength and mixing</h3>" + html.line_chart(
            curves, x_label="s or α", y_label="similarity", log=False))  # fmt: skip
    work = Path(result["work"]) if "work" in result else None
    if work is not None and (work / "references.npy").exists():
        grid = [("reference", [html.png_data_uri(upscale(im))
                               for im in np.load(work / "references.npy")[:8]])]  # fmt: skip
        shown = [(k, "none" if k == "none" else f"{k}-s1.0") for k in NAMES]
        for key, name in shown:
            if (work / f"{name}.npy").exists():
                images = np.load(work / f"{name}.npy")[:8, 0]
                grid.append((NAMES[key], [html.png_data_uri(upscale(im)) for im in images]))
        prompts = result.get("prompts", [])[:8]
        parts.append("<h3>Held-out references and prompts, first seed</h3>"
                     + html.image_table(prompts, grid))  # fmt: skip
    return "".join(parts)
