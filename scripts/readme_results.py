"""Write the README's results table from a demo run's summary.json.

The README shows one table of the newest full demo's chain, generated, never typed: the
chain stages' ShapesEval with CFG and without, each with its paired difference to the
stage before ± its standard error, and the share of images with every requirement right.
It lives between ``<!-- results:begin -->`` and ``<!-- results:end -->``; everything else in
the README is left as it is.

    python scripts/readme_results.py DEMO_OUT/summary.json --when 2026-12-05 \\
        --machine "2-core Intel Xeon VM, shared"
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SETTINGS = (("cfg", "CFG"), ("no_cfg", "no CFG"))


def _delta(m: dict) -> str:
    d = m.get("delta")
    return f"{d['delta']:+.3f} ± {d['se']:.3f}" if d else ""


def results_table(summary: dict, when: str, machine: str) -> str:
    """The markdown of the chain's table from a summary (its ``chain`` entry), headed by
    the run's date and machine and its evaluation settings. KeyError when the summary has
    no chain (a demo from before the chain, or a stopped run)."""
    chain = summary["chain"]
    st = chain["settings"]
    cfg = f"CFG {st['cfg']:g}"
    header = ["chain stage"]
    for _, label in SETTINGS:
        name = cfg if label == "CFG" else label
        header += [f"ShapesEval, {name}", "Δ ± SE", f"all correct, {name}"]
    rows = []
    for name, model in chain.items():
        if name == "settings":
            continue
        row = [name]
        for key, _ in SETTINGS:
            m = model[key]
            row += [f"{m['shapes_eval']:.3f}", _delta(m), f"{m['all_correct']:.3f}"]
        rows.append(row)
    lines = [
        f"Newest full demo ({when}, {machine}; `python scripts/readme_results.py` writes this "
        f"table from its summary.json): {st['prompts']} held-out prompts × {len(st['seeds'])} "
        f"seeds, {st['steps']} Euler steps; Δ: paired difference to the stage before ± its "
        "standard error over the prompts.",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    if "turbo" in summary:
        lines += ["", *turbo_table(summary["turbo"], st["steps"])]
    return "\n".join(lines)


def turbo_table(turbo: dict, teacher_steps: int) -> list[str]:
    """Lines of Turbo's table: the student at its own steps without CFG against raw (the
    teacher) at as many steps with CFG and at ``teacher_steps`` with and without, with the
    paired differences."""
    m, keys = turbo["measures"], turbo["keys"]
    student = m[keys["student"]]
    k = student["steps"]
    rows = [[f"Turbo (TDM), {k} steps, no CFG", f"{student['shapes_eval']:.3f}",
             f"{student['all_correct']:.3f}", ""]]  # fmt: skip
    for key, label in (("teacher", f"S{k} - T{teacher_steps}"), ("teacher_k", f"S{k} - T{k}"),
                       ("teacher_no_cfg", f"S{k} - T{teacher_steps} no CFG")):  # fmt: skip
        v, d = m[keys[key]], turbo["deltas"][label]
        cfg = f"CFG {v['cfg']:g}" if v["cfg"] else "no CFG"
        rows.append([f"raw, {v['steps']} steps, {cfg}", f"{v['shapes_eval']:.3f}",
                     f"{v['all_correct']:.3f}", f"{d['delta']:+.3f} ± {d['se']:.3f}"])  # fmt: skip
    sp = turbo.get("speed") or {}
    speed = (f" It samples {sp['speedup_vs_cfg']:.1f}x faster per image than raw with CFG at "
             f"{teacher_steps} steps." if sp else "")  # fmt: skip
    head = ["model", "ShapesEval", "all correct", "Turbo − this ± SE"]
    return [
        f"Turbo, distilled from raw by TDM (the demo's last stage), on the same prompts and "
        f"seeds.{speed}",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def replace_section(text: str, section: str) -> str:
    """``text`` with what lies between the markers replaced by ``section``; ValueError when
    the markers are missing or out of order (the README is never guessed at)."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"the README needs exactly one {BEGIN} ... {END} pair")
    return pattern.sub(lambda _: f"{BEGIN}\n{section}\n{END}", text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summary", type=Path, help="a full demo's summary.json")
    ap.add_argument("--when", required=True, help="the run's date, e.g. 2026-12-05")
    ap.add_argument("--machine", required=True, help="where it ran, e.g. '2-core AMD VM'")
    ap.add_argument("--readme", type=Path, default=Path(__file__).parents[1] / "README.md")
    args = ap.parse_args()
    summary = json.loads(args.summary.read_text())
    text = args.readme.read_text()
    args.readme.write_text(replace_section(text, results_table(summary, args.when, args.machine)))
    print(f"wrote the results table of {args.summary} into {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
