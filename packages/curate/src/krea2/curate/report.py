"""The HTML curation report: rejects per reason, score histograms, example grids, dup groups."""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from krea2.curate.evaluate import clean_kept, precision_recall
from krea2.curate.filters import CHEAP_FILTERS
from krea2.curate.stages import final_reason

Thumb = Callable[[str], np.ndarray | None]


def thumbnail(uri: str) -> np.ndarray | None:
    """(h, w, 3) uint8 pixels of the image at ``uri``, longest side 128 px; None if it
    cannot be read or decoded."""
    from krea2.curate.decode import DecodeError, DecodeLimits, decode
    from krea2.curate.storage import read_uri

    try:
        return decode(read_uri(uri), DecodeLimits(analysis_size=128)).pixels
    except (OSError, DecodeError):
        return None


def _png(pixels: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _histogram(name: str, values: list[float], rejected: list[bool]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.2, 2.2), dpi=90)
    v = np.asarray(values, float)
    r = np.asarray(rejected, bool)
    bins = np.histogram_bin_edges(v, bins=30) if len(v) else 10
    ax.hist(
        [v[~r], v[r]],
        bins=bins,
        stacked=True,
        label=["kept", f"rejected by {name}"],
        color=["#4c78a8", "#e45756"],
    )
    ax.set_title(name, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _img_tag(thumb: Thumb, row: dict, caption: str) -> str:
    px = thumb(row["uri"]) if row.get("uri") else None
    title = html.escape(f"{row['image_key']}: {row.get('reason') or caption}")
    if px is None:
        return (
            f'<figure title="{title}"><div class="missing">unreadable</div>'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    return (
        f'<figure title="{title}"><img src="{_png(px)}"><figcaption>'
        f"{html.escape(caption)}</figcaption></figure>"
    )


def write_report(
    rows: Sequence[dict],
    out_dir: Path,
    labels: dict[str, str] | None = None,
    examples: int = 8,
    groups: int = 12,
    thumb: Thumb = thumbnail,
) -> dict:
    """Write ``out_dir/index.html`` and ``out_dir/summary.json`` for warehouse ``rows``
    (``read_rows``), each judged by ``final_reason``.

    ``labels`` (image_key → ground-truth label, e.g. from a ShapesWorld pool) adds precision
    and recall per defect class; ``thumb(uri)`` gives an example's pixels. Returns the
    summary dict.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    reasons = [final_reason(r) for r in rows]
    counts = Counter(r or "kept" for r in reasons)
    summary: dict = {"images": len(rows), "reasons": dict(counts.most_common())}
    parts = ["<h2>Verdicts</h2><table><tr><th>reason</th><th>images</th><th>share</th></tr>"]
    for reason, n in counts.most_common():
        parts.append(
            f"<tr><td>{html.escape(reason)}</td><td>{n}</td>"
            f"<td>{n / max(1, len(rows)):.1%}</td></tr>"
        )
    parts.append("</table>")

    if labels:
        lab = [labels.get(r["image_key"], "unlabelled") for r in rows]
        # Membership of an over-represented concept counts as its detection (the cap then
        # keeps a fair share of those images on purpose).
        detection = [
            rs or ("overrepresented" if r.get("concept_over") else None)
            for r, rs in zip(rows, reasons, strict=True)
        ]
        metrics = precision_recall(lab, detection)
        summary["precision_recall"] = metrics
        summary["clean_kept"] = clean_kept(lab, reasons)
        parts.append(
            "<h2>Precision and recall per defect class</h2><table><tr><th>class</th>"
            "<th>precision</th><th>recall</th><th>support</th><th>flagged</th></tr>"
        )
        for cls, m in metrics.items():
            parts.append(
                f"<tr><td>{cls}</td><td>{m['precision']:.3f}</td><td>{m['recall']:.3f}"
                f"</td><td>{int(m['support'])}</td><td>{int(m['flagged'])}</td></tr>"
            )
        parts.append(f"</table><p>clean images kept: {summary['clean_kept']:.3f}</p>")

    parts.append("<h2>Score histograms</h2><div class='grid'>")
    for name in CHEAP_FILTERS:
        vals = [
            (r[f"score_{name}"], r.get("reject") == name)
            for r in rows
            if r.get(f"score_{name}") is not None
        ]
        if vals:
            src = _histogram(name, [v for v, _ in vals], [x for _, x in vals])
            parts.append(f'<img src="{src}">')
    text = [
        (r["text_area"], r.get("text_reject") == "text_density")
        for r in rows
        if r.get("text_area") is not None
    ]
    if text:
        parts.append(
            f'<img src="{_histogram("text_density", *map(list, zip(*text, strict=True)))}">'
        )
    parts.append("</div><h2>Examples per reason</h2>")
    for reason in [r for r, _ in counts.most_common()]:
        members = [row for row, rs in zip(rows, reasons, strict=True) if (rs or "kept") == reason]
        parts.append(f"<h3>{html.escape(reason)} ({len(members)})</h3><div class='grid'>")
        parts += [_img_tag(thumb, row, row["image_key"]) for row in members[:examples]]
        parts.append("</div>")

    by_keeper: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("dup_of"):
            by_keeper.setdefault(r["dup_of"], []).append(r)
    dup_groups = [g for g in by_keeper.values() if len(g) > 1]
    summary["duplicate_groups"] = len(dup_groups)
    parts.append(f"<h2>Duplicate groups ({len(dup_groups)}; keeper first)</h2>")
    for g in dup_groups[:groups]:
        g = sorted(g, key=lambda r: (not r.get("dup_keep"), r["image_key"]))
        parts.append("<div class='grid group'>")
        parts += [
            _img_tag(thumb, r, ("keep " if r.get("dup_keep") else "") + (r.get("dup_kind") or ""))
            for r in g
        ]
        parts.append("</div>")

    style = (
        "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px} .grid{display:flex;flex-wrap:wrap;"
        "gap:6px} figure{margin:0;width:132px;font-size:10px;overflow:hidden}"
        "figure img{max-width:128px;max-height:128px} .group{border:1px solid #999;"
        "padding:4px;margin:4px 0} .missing{width:128px;height:64px;background:#eee}"
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>krea2 curate report"
        f"</title><style>{style}</style></head><body><h1>Curation report</h1>"
        f"<p>{len(rows)} images</p>{''.join(parts)}</body></html>"
    )
    (out_dir / "index.html").write_text(page)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary
