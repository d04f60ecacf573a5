"""The ShapesWorld verifier on degraded renders with known labels, forced choice vs unclear.

``--scenes`` seeded scenes (1-3 objects of all four shapes, all sizes and backgrounds) are
rendered at 32, 64 and 128 px, clean and degraded by blur, corner rounding, ragged edges,
jitter, colour noise and all of them at once ("model"), each kind at a mild, a medium and
(blur, round, ragged) a stress strength (``krea2.curate.shapes.verifier_validation``). For
every object: the verifier's shape read and its template-IoU margin. Reported: the
confusion (true shape vs read) without and with the unclear verdict, accuracy per
degradation and resolution, the unclear margin recomputed from ``--calibration-scenes``
scenes of the "model" degradation (the rule ``detect.UNCLEAR_MARGIN`` was set by), and the
clean, blurred and "model" reads again with the same scenes on the style stage's
backgrounds.

Run from the root: ``uv run --frozen python -m benchmarks.shapes_verifier`` (under 2
minutes on 2 cores, ~70 s of CPU). Writes benchmarks/results/shapes-verifier.json and the
``shapes-verifier`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.report import table, write_results
from krea2.curate.shapes.detect import UNCLEAR_MARGIN
from krea2.curate.shapes.spec import SHAPES
from krea2.curate.shapes.verifier_validation import (
    DEGRADATIONS,
    RESOLUTIONS,
    TARGET_ACCURACY,
    ShapeRead,
    calibrate_margin,
    calibration_reads,
    confusion,
    summarize,
    validate,
)

READS = [*SHAPES, "unclear", "missed"]
# Degradations also read on the style stage's backgrounds (validate(backgrounds="styled")).
STYLED_KINDS = ("clean", "blur", "model")


def _init_worker() -> None:
    import cv2

    cv2.setNumThreads(1)  # one process per core instead


def _run(job: tuple[str, int, int, int, str]) -> list[ShapeRead]:
    """One share of the work: the validation of one resolution and degradation kind (on
    the world's backgrounds or, ``styled``, the style stage's), or the calibration reads of
    one resolution (every share draws its own random streams, so the split does not change
    a read)."""
    what, n, seed, size, kind = job
    if what == "calibration":
        return calibration_reads(n, seed, resolutions=(size,))
    backgrounds = "styled" if what == "styled" else "world"
    return validate(n, seed, resolutions=(size,), degradations={kind: DEGRADATIONS[kind]},
                    backgrounds=backgrounds)  # fmt: skip


def _rounded(d: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}


def measure(scenes: int, seed: int, calibration_scenes: int, workers: int) -> dict:
    start = time.perf_counter()
    jobs = [("calibration", calibration_scenes, seed, z, "model") for z in RESOLUTIONS]
    jobs = jobs if calibration_scenes else []
    jobs += [("validation", scenes, seed, z, k) for z in RESOLUTIONS for k in DEGRADATIONS]
    jobs += [("styled", scenes, seed, z, k) for z in RESOLUTIONS for k in STYLED_KINDS]
    with ProcessPoolExecutor(workers, initializer=_init_worker) as pool:
        parts = dict(zip(jobs, pool.map(_run, jobs), strict=True))
    cal = [r for job, part in parts.items() if job[0] == "calibration" for r in part]
    reads = [r for job, part in parts.items() if job[0] == "validation" for r in part]
    styled = [r for job, part in parts.items() if job[0] == "styled" for r in part]
    seconds = time.perf_counter() - start
    kept = [r for r in reads if not r.stress]
    stress = [r for r in reads if r.stress]
    rows = []
    for kind, strengths in DEGRADATIONS.items():
        for strength in strengths:
            row: dict = {"kind": kind, "strength": strength}
            for size in RESOLUTIONS:
                sub = [
                    r for r in reads if (r.kind, r.strength, r.resolution) == (kind, strength, size)
                ]
                new = summarize(sub, UNCLEAR_MARGIN)
                row[str(size)] = _rounded(
                    {
                        "forced": summarize(sub, 0.0)["forced"],
                        "decided": new["decided"],
                        "unclear": new["unclear"],
                        "passed": new["passed"],
                        "cell": sum(r.cell_ok for r in sub) / max(len(sub), 1),
                    }
                )
            rows.append(row)
    by_background = []
    for kind in STYLED_KINDS:
        for strength in DEGRADATIONS[kind]:
            row = {"kind": kind, "strength": strength}
            for size in RESOLUTIONS:
                key = (kind, strength, size)
                pair = [[r for r in rs if (r.kind, r.strength, r.resolution) == key]
                        for rs in (reads, styled)]  # fmt: skip
                row[str(size)] = [round(summarize(p, UNCLEAR_MARGIN)["passed"], 4) for p in pair]
            by_background.append(row)
    per_shape = {
        s: _rounded(summarize([r for r in kept if r.true_shape == s], UNCLEAR_MARGIN))
        | {"forced": round(summarize([r for r in kept if r.true_shape == s], 0.0)["forced"], 4)}
        for s in SHAPES
    }
    return {
        "settings": {"scenes": scenes, "seed": seed, "calibration_scenes": calibration_scenes},
        "seconds": round(seconds, 1),
        "unclear_margin": UNCLEAR_MARGIN,
        "target_accuracy": TARGET_ACCURACY,
        "calibration": {
            "margin_recomputed": calibrate_margin(cal) if cal else None,
            "at_constant": _rounded(summarize(cal, UNCLEAR_MARGIN)) if cal else None,
            "forced": round(summarize(cal, 0.0)["forced"], 4) if cal else None,
        },
        "overall": {
            "non_stress": _rounded(summarize(kept, UNCLEAR_MARGIN)),
            "non_stress_forced": round(summarize(kept, 0.0)["forced"], 4),
            "stress": _rounded(summarize(stress, UNCLEAR_MARGIN)),
            "stress_forced": round(summarize(stress, 0.0)["forced"], 4),
        },
        "confusion": {
            "forced": confusion(kept, 0.0),
            "unclear": confusion(kept, UNCLEAR_MARGIN),
            "stress_forced": confusion(stress, 0.0),
            "stress_unclear": confusion(stress, UNCLEAR_MARGIN),
        },
        "per_shape": per_shape,
        "per_degradation": rows,
        "by_background": by_background,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(res: dict) -> str:
    m, o, cal = res["unclear_margin"], res["overall"], res["calibration"]
    stress = ", ".join(f"{k} {v[-1]}" for k, v in DEGRADATIONS.items() if len(v) == 3)
    forced, new = res["confusion"]["forced"], res["confusion"]["unclear"]
    conf_rows = [
        [s]
        + [
            f"{forced.get(s, {}).get(r, 0)} → {new.get(s, {}).get(r, 0)}"
            if r != "unclear"
            else str(new.get(s, {}).get(r, 0))
            for r in READS
        ]
        + [
            f"{_pct(res['per_shape'][s]['forced'])} → {_pct(res['per_shape'][s]['decided'])}",
            _pct(res["per_shape"][s]["unclear"]),
        ]
        for s in SHAPES
    ]
    deg_rows = [
        [row["kind"], row["strength"]]
        + [
            f"{_pct(row[str(z)]['forced'])} / {_pct(row[str(z)]['decided'])} / "
            f"{_pct(row[str(z)]['unclear'])}"
            for z in RESOLUTIONS
        ]
        for row in res["per_degradation"]
    ]
    recomputed = (
        f"recomputed from {res['settings']['calibration_scenes']} scenes of the `model` "
        f"degradation: **{cal['margin_recomputed']}** (reads decided there "
        f"{_pct(cal['at_constant']['decided'])}% right, forced choice "
        f"{_pct(cal['forced'])}%, unclear {_pct(cal['at_constant']['unclear'])}%). "
        if cal["margin_recomputed"] is not None
        else ""
    )
    return (
        "## ShapesWorld verifier on degraded renders (`benchmarks/shapes_verifier.py`)\n\n"
        f"{res['settings']['scenes']} seeded scenes (1-3 objects, all four shapes and sizes) "
        f"at {', '.join(map(str, RESOLUTIONS))} px, clean and degraded "
        "(`krea2.curate.shapes.verifier_validation`), each object's shape read by the "
        f"verifier. Unclear margin `detect.UNCLEAR_MARGIN` = **{m}**: the smallest margin "
        f"whose decided reads are ≥ {_pct(res['target_accuracy'])}% right on the `model` "
        f"degradation; {recomputed}\n\n"
        f"Without the stress strengths: forced choice {_pct(o['non_stress_forced'])}% right; "
        f"with the unclear verdict the decided reads are {_pct(o['non_stress']['decided'])}% "
        f"right, {_pct(o['non_stress']['unclear'])}% are unclear. Stress strengths ({stress}): "
        f"forced {_pct(o['stress_forced'])}%, decided "
        f"{_pct(o['stress']['decided'])}%, unclear {_pct(o['stress']['unclear'])}%.\n\n"
        "True shape (rows) vs read, forced choice → with the unclear verdict (stress "
        "strengths left out); accuracy of the decided reads, %:\n\n"
        + table(["true \\ read", *READS, "accuracy, forced → decided", "unclear %"], conf_rows)
        + "\n\nPer degradation (strength units in the module docstring): forced accuracy / "
        "accuracy of the decided reads / unclear share, %, by resolution:\n\n"
        + table(["kind", "strength", *(f"{z} px" for z in RESOLUTIONS)], deg_rows)
        + background_section(res)
        + f"\n\n{res['seconds']} s with {res.get('workers', 2)} worker processes."
    )


def background_section(res: dict) -> str:
    """The shapes read right and clear on the world's backgrounds against the style
    stage's, the same scenes and objects (absent from results written before it)."""
    rows = res.get("by_background")
    if not rows:
        return ""
    body = [[r["kind"], r["strength"]]
            + [f"{_pct(r[str(z)][0])} → {_pct(r[str(z)][1])}" for z in RESOLUTIONS]
            for r in rows]  # fmt: skip
    return (
        '\n\nThe same scenes on the style stage\'s backgrounds (`backgrounds="styled"`: '
        "solid, gradient or texture in any background colour, the objects unchanged), so a "
        "style module's content score reads its objects, not its background: shapes read "
        "right and clear, %, world's backgrounds → styled, by resolution:\n\n"
        + table(["kind", "strength", *(f"{z} px" for z in RESOLUTIONS)], body)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibration-scenes", type=int, default=2000, help="0 skips it")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report-only", type=Path, help="Re-render the docs section from a JSON.")
    args = ap.parse_args()
    if args.report_only:
        res = json.loads(args.report_only.read_text())
    else:
        res = measure(args.scenes, args.seed, args.calibration_scenes, args.workers)
        res["workers"] = args.workers
    print(markdown(res))
    write_results("shapes-verifier", res, markdown(res))
    print("wrote benchmarks/results/shapes-verifier.json and its docs/benchmarks.md section")


if __name__ == "__main__":
    main()
