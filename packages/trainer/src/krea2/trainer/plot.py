"""``krea2 train plot``: loss curves of a run as PNG and a self-contained HTML page."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.trainer.observe import read_metrics


def _series(rows: list[dict], kind: str, key: str) -> dict[str, tuple[list, list]]:
    out: dict[str, tuple[list, list]] = {}
    for r in rows:
        if r.get("kind") == kind and r.get(key) is not None:
            xs, ys = out.setdefault(r["stage"], ([], []))
            xs.append(r["step"])
            ys.append(r[key])
    return out


# What an empty panel means, said in the panel instead of leaving it blank.
EMPTY_PANEL = {
    "held-out loss": "no held-out set: no stage has eval_data",
    "iREPA loss": "iREPA was off (irepa.steps = 0)",
}


def plot_run(run_dir: Path, out: Path | None = None) -> tuple[Path, Path]:
    """Training loss (raw and smoothed), held-out loss, loss per time bucket, grad norm,
    learning rate and iREPA loss, one panel each (an empty one says why); and an HTML page
    with the plot and the newest sample grids under their prompts. Returns the PNG and
    HTML paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise UserError(f"{path} does not exist; point at a run directory of krea2 train")
    rows = read_metrics(path)
    if not rows:
        raise UserError(f"{path} has no metrics yet")
    panels = [
        ("train loss", [("train", "loss")]),
        ("held-out loss", [("eval", "eval_loss")]),
        ("loss by t quarter", [("train", f"loss_t{b}") for b in range(4)]),
        ("grad norm", [("train", "grad_norm")]),
        ("learning rate", [("train", "lr")]),
        ("iREPA loss", [("train", "irepa_loss")]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    notes = []
    for ax, (title, keys) in zip(axes.flat, panels, strict=True):
        for kind, key in keys:
            for stage, (xs, ys) in _series(rows, kind, key).items():
                label = f"{stage} {key}" if len(keys) > 1 else stage
                marker = "o" if len(xs) < 30 else None
                ax.plot(
                    xs, ys, lw=0.8, alpha=0.5 if key == "loss" else 1.0, label=label, marker=marker
                )
                if key == "loss" and len(ys) > 10:
                    k = max(1, len(ys) // 20)
                    smooth = [
                        sum(ys[max(0, i - k) : i + 1]) / len(ys[max(0, i - k) : i + 1])
                        for i in range(len(ys))
                    ]
                    ax.plot(xs, smooth, lw=1.5, label=f"{stage} (mean of {k + 1})")
        ax.set_title(title)
        ax.set_xlabel("step")
        if not ax.lines:
            note = EMPTY_PANEL.get(title, "not recorded in this run")
            notes.append(f"{title}: {note}")
            ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, wrap=True)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        if title in ("train loss", "held-out loss", "grad norm"):
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    prefix = out or Path(run_dir) / "curves"
    png = prefix.with_suffix(".png")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    page_path = prefix.with_suffix(".html")
    page_path.write_text(_page(Path(run_dir), png, notes))
    return png, page_path


def _page(run_dir: Path, png: Path, notes: list[str]) -> str:
    """The HTML page: the curves, what was not recorded, and the six newest sample grids,
    each captioned with its file name and prompts (from the JSON beside it)."""
    figures = []
    for grid in sorted((run_dir / "samples").glob("*.png"))[-6:]:
        meta = grid.with_suffix(".json")
        prompts = json.loads(meta.read_text()).get("prompts", []) if meta.exists() else []
        listed = "".join(f"<li>{html.escape(p)}</li>" for p in prompts)
        figures.append(
            f"<figure><img src='data:image/png;base64,{_b64(grid)}'>"
            f"<figcaption>{html.escape(grid.name)}<ol>{listed}</ol></figcaption></figure>"
        )
    missing = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(str(run_dir))}</title>"
        f"<h1>{html.escape(str(run_dir))}</h1><img src='data:image/png;base64,{_b64(png)}'>"
        + (f"<ul class='not-recorded'>{missing}</ul>" if notes else "")
        + f"<h2>samples</h2>{''.join(figures) or '<p>no sample grids yet</p>'}"
    )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()
