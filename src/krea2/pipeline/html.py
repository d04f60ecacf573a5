"""A self-contained HTML report: inline CSS, images as data URIs, charts as inline SVG."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1100px;color:#1d1d1f;line-height:1.45;padding:0 1rem}
h1{font-size:1.8rem}h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}
table{border-collapse:collapse;margin:.8rem 0;font-size:.92rem}
td,th{border:1px solid #ddd;padding:.3rem .6rem;text-align:right}
th{background:#f5f5f7}td:first-child,th:first-child{text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:.6rem}.cell{width:140px;font-size:.75rem}
.cell img{width:128px;height:128px;image-rendering:pixelated;border:1px solid #ccc}
.note{color:#666;font-size:.9rem}.good{color:#1a7f37}.bad{color:#c62828}
svg{background:#fff;border:1px solid #ddd}
table.images td{padding:2px}table.images th.caption{font-size:.7rem;font-weight:normal;
width:104px;text-align:left;vertical-align:bottom}
.warning{background:#fff4ce;border-left:4px solid #e0a800;padding:.6rem .9rem}
"""


def escape(text: Any) -> str:
    return html.escape(str(text))


def png_data_uri(pixels: np.ndarray) -> str:
    """``pixels`` (H, W, 3) uint8 → ``data:image/png;base64,...``."""
    buf = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def bytes_data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image_grid(items: Sequence[tuple[str, str]]) -> str:
    """``items``: (data URI, caption) pairs."""
    cells = "".join(
        f'<div class="cell"><img src="{uri}" alt="{escape(cap)}"><div>{escape(cap)}</div></div>'
        for uri, cap in items
    )
    return f'<div class="grid">{cells}</div>'


def image_table(
    columns: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]], side: int = 104
) -> str:
    """Images in a labelled grid: a caption over each column, and ``rows`` of (label, data
    URIs, one per column), each image shown ``side`` px square (pixelated when enlarged)."""
    head = "<th></th>" + "".join(f'<th class="caption">{escape(c)}</th>' for c in columns)
    body = "".join(
        f"<tr><th>{escape(label)}</th>"
        + "".join(
            f'<td><img src="{uri}" alt="{escape(label)}: {escape(c)}" width="{side}" '
            f'height="{side}" style="image-rendering:pixelated"></td>'
            for uri, c in zip(uris, columns, strict=True)
        )
        + "</tr>"
        for label, uris in rows
    )
    return f'<table class="images"><tr>{head}</tr>{body}</table>'


def line_chart(
    series: dict[str, Sequence[tuple[float, float]]],
    width: int = 640,
    height: int = 260,
    x_label: str = "step",
    y_label: str = "loss",
    log: bool | None = None,
) -> str:
    """An inline SVG line chart of named (x, y) series; y on a log scale when ``log`` (by
    default: when every y is positive). A linear chart spanning 0 marks y = 0 dashed."""
    points = [p for s in series.values() for p in s]
    if not points:
        return '<p class="note">no data</p>'
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    log = min(ys) > 0 if log is None else log and min(ys) > 0
    ty = (lambda y: float(np.log10(y))) if log else float
    x0, x1 = min(xs), max(xs) or 1
    y0, y1 = ty(min(ys)), ty(max(ys))
    if y1 == y0:
        y1 = y0 + 1
    if x1 == x0:
        x1 = x0 + 1
    pad = 40

    def sx(x: float) -> float:
        return pad + (x - x0) / (x1 - x0) * (width - 2 * pad)

    def sy(y: float) -> float:
        return height - pad - (ty(y) - y0) / (y1 - y0) * (height - 2 * pad)

    colors = ["#0a84ff", "#ff9f0a", "#30d158", "#bf5af2", "#ff375f"]
    lines = []
    legend = []
    for i, (name, s) in enumerate(series.items()):
        color = colors[i % len(colors)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        legend.append(
            f'<text x="{width - pad - 150}" y="{pad + 14 * i}" fill="{color}" '
            f'font-size="12">{escape(name)}</text>'
        )
    lo, hi = min(ys), max(ys)
    if not log and lo < 0 < hi:
        lines.insert(
            0,
            f'<line x1="{pad}" y1="{sy(0):.1f}" x2="{width - pad}" y2="{sy(0):.1f}" '
            'stroke="#bbb" stroke-dasharray="4 3"/>',
        )
    axes = (
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        f'stroke="#999"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#999"/>'
        f'<text x="{width / 2}" y="{height - 8}" font-size="12" text-anchor="middle">'
        f"{escape(x_label)}</text>"
        f'<text x="4" y="{pad - 8}" font-size="12">{escape(y_label)}{" (log)" if log else ""}'
        f"</text>"
        f'<text x="{pad + 4}" y="{sy(hi) + 12:.1f}" font-size="10">{hi:.3g}</text>'
        f'<text x="{pad + 4}" y="{sy(lo) - 4:.1f}" font-size="10">{lo:.3g}</text>'
        f'<text x="{pad}" y="{height - pad + 14}" font-size="10">{x0:g}</text>'
        f'<text x="{width - pad}" y="{height - pad + 14}" font-size="10" '
        f'text-anchor="end">{x1:g}</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f"{axes}{''.join(lines)}{''.join(legend)}</svg>"
    )


def page(title: str, sections: Sequence[tuple[str, str]], intro: str = "") -> str:
    body = "".join(f"<h2>{escape(h)}</h2>{content}" for h, content in sections)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}'
        f"</title><style>{STYLE}</style></head><body><h1>{escape(title)}</h1>{intro}{body}"
        "</body></html>"
    )
