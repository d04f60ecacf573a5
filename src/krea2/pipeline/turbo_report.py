"""The turbo stage on summary.json, report.html and the console: a table per (model, steps,
CFG), ShapesEval against steps, the paired differences and checks, speed, the losses and
the first seed's samples side by side (:mod:`krea2.pipeline.turbo_stage` measures them)."""

from __future__ import annotations

import numpy as np

HEADERS = ["model", "steps", "CFG", "ShapesEval", "all correct", "saturation",
           "background noise", "spread: position", "size", "background"]  # fmt: skip


def rows(result: dict) -> list[list[str]]:
    """Rows of :data:`HEADERS`: the student at each step count, then the teacher."""
    out = []
    for m in result["measures"].values():
        sp = m["spread"]
        out.append([m["who"], str(m["steps"]), f"{m['cfg']:g}" if m["cfg"] else "none",
                    f"{m['shapes_eval']:.3f}", f"{m['all_correct']:.3f}",
                    f"{m['saturation']:.3f}", f"{m['bg_noise']:.2f}", f"{sp['position']:.3f}",
                    f"{sp['size']:.3f}", f"{sp['background']:.3f}"])  # fmt: skip
    return out


def summary(result: dict) -> dict:
    """summary.json's ``turbo``: the measures (sample paths left out), the paired
    differences, the checks, the speed and the seconds."""
    measures = {k: {f: v for f, v in m.items() if f != "samples"}
                for k, m in result["measures"].items()}  # fmt: skip
    return {"measures": measures, "keys": result["keys"], "deltas": result["deltas"],
            "checks": result["checks"], "speed": result["speed"], "model": result["model"],
            "seconds": result["seconds"]}  # fmt: skip


def summary_lines(result: dict) -> list[str]:
    """The console's closing lines: the student against its teacher, each check."""
    m, keys = result["measures"], result["keys"]
    s_, t = m[keys["student"]], m[keys["teacher"]]
    lines = [
        f"turbo: student {s_['steps']} steps without CFG {s_['shapes_eval']:.3f}, teacher "
        f"{t['steps']} steps with CFG {t['cfg']:g} {t['shapes_eval']:.3f}; "
        f"{result['speed']['speedup_vs_cfg']:.1f}x faster per image"
    ]
    for name, c in result["checks"].items():
        lines.append(f"turbo: {name} {'holds' if c['holds'] else 'does NOT hold'}: {c['why']}")
    return lines


def report_section(result: dict, prompts: list[str], upscale) -> str:  # type: ignore[no-untyped-def]
    """The turbo stage on report.html: the table, ShapesEval against steps (student without
    CFG, teacher with and without), the paired differences and checks, the speed, the
    fake-score and student curves, and the first seed's samples side by side."""
    from krea2.pipeline import html

    st, m, keys = result["settings"], result["measures"], result["keys"]
    parts = [html.table(HEADERS, rows(result))]
    series: dict[str, list[tuple[float, float]]] = {}
    for v in m.values():
        label = f"{v['who']}, " + (f"CFG {v['cfg']:g}" if v["cfg"] else "no CFG")
        series.setdefault(label, []).append((float(v["steps"]), float(v["shapes_eval"])))
    parts.append(
        "<h3>ShapesEval against sampling steps</h3>"
        + html.line_chart(
            {k: sorted(v) for k, v in series.items()},
            x_label="Euler steps",
            y_label="ShapesEval",
            log=False,
        )
    )
    deltas = "".join(
        f"<li>{html.escape(name)}: {d['delta']:+.3f} ± {d['se']:.3f}</li>"
        for name, d in result["deltas"].items()
    )
    checks = "".join(
        f"<li>{html.escape(name)}: {'holds' if c['holds'] else 'does not hold'} "
        f"({html.escape(c['why'])})</li>"
        for name, c in result["checks"].items()
    )
    sp, tdm = result["speed"], st["tdm"]
    parts.append(
        f'<p class="note">The student: {tdm["mode"]}, {tdm["student_steps"]} steps, '
        f"{st['steps']} iterations of {st['prompts_per_step']} training-concept prompts at lr "
        f"{st['lr']:g}, from raw with CFG at Ho's g = {tdm['teacher_guidance']:g} (krea2's "
        f"scale {tdm['teacher_guidance'] - 1:g}). Measured on {st['prompts']} held-out "
        f"prompts x {len(st['seeds'])} seeds; Δ ± the paired standard error over the prompts. "
        f"Spread: the std over seeds of the largest detected object's position and size and "
        f"of the background colour (a collapsed student draws one picture per prompt). "
        f"Speed, per image on this machine: teacher {st['teacher_steps']} steps with CFG "
        f"{sp['teacher_cfg_s_per_image'] * 1e3:.1f} ms, without "
        f"{sp['teacher_no_cfg_s_per_image'] * 1e3:.1f} ms, student "
        f"{sp['student_s_per_image'] * 1e3:.1f} ms ({sp['speedup_vs_cfg']:.1f}x and "
        f"{sp['speedup_vs_no_cfg']:.1f}x for {sp['nfe_ratio_vs_cfg']:g}x and "
        f"{sp['nfe_ratio_vs_no_cfg']:g}x fewer network evaluations).</p>"
        f"<ul>{deltas}</ul><ul>{checks}</ul>"
    )
    c = result["curves"]
    lines = {k: [(float(s), float(v)) for s, v in zip(c["step"], c[k], strict=True)
                 if v is not None] for k in ("loss", "fake_loss", "teacher_fake_gap")}  # fmt: skip
    if any(lines.values()):
        parts.append(
            "<h3>Student and fake-score losses</h3>"
            + html.line_chart(
                {k: v for k, v in lines.items() if v}, x_label="iteration", y_label="loss", log=True
            )
        )
    shown = [keys["teacher"], keys["teacher_k"],
             *(k for k, v in m.items() if v["who"] == "student")]  # fmt: skip
    grid = []
    for key in shown:
        v = m[key]
        label = f"{v['who']} {v['steps']} steps, " + (f"CFG {v['cfg']:g}" if v["cfg"] else "no CFG")
        images = np.load(v["samples"])[:8, 0]
        grid.append((label, [html.png_data_uri(upscale(im)) for im in images]))
    parts.append("<h3>Held-out prompts, first seed</h3>" + html.image_table(prompts[:8], grid))
    return "".join(parts)
