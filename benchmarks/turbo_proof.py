"""The Turbo proof: TDM from a demo's raw model over 3 training seeds, against DMD2 at equal
wall clock, TDM without importance weights and a 1-step student (issue #41's must-shows).

Every variant distils the chain's raw model of a finished full demo (``--demo DIR``,
``krea2 demo --out DIR``) with the demo's ``[turbo]`` settings, changed as the variant says
(``--variant NAME:key=value,...``, keys of ``[turbo]`` or ``[turbo.tdm]``; ``seed=N`` sets
the run's draws). Each student is measured as the demo's turbo stage measures it
(``krea2.pipeline.turbo_stage.measure``: held-out prompts x ``[eval]``'s seeds, the
student at 1, 2 and 4 steps without CFG, the teacher with and without CFG; paired
differences over the prompts). DMD2 is read at equal wall clock: its checkpoint whose
summed step time is the last not above TDM seed 0's (``checkpoint_every`` apart).

Run from the root after a full demo: ``uv run --frozen python -m benchmarks.turbo_proof
--demo DIR``. Writes benchmarks/results/turbo-proof.json and the ``turbo-proof`` section
of docs/benchmarks.md; the runs and samples stay under ``--work`` (default
``DIR/turbo-proof``), so a rerun resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from benchmarks.report import parse_settings, table, write_results

VARIANTS = [
    "tdm-seed0:seed=0",
    "tdm-seed1:seed=1",
    "tdm-seed2:seed=2",
    "dmd2:seed=0,mode=dmd2,checkpoint_every=20",
    "tdm-no-importance-weights:seed=0,importance_weights=false",
    "tdm-2-steps:seed=0,student_steps=2",
    "tdm-1-step:seed=0,student_steps=1",
]
CHECKS = ("quality", "beats_fewer_teacher_steps", "guidance_distilled", "no_collapse",
          "no_drift")  # fmt: skip


def parse_variant(text: str, base: Any) -> tuple[str, Any, int | None]:
    """``NAME:key=value,...`` -> (NAME, ``base`` changed, the seed or None)."""
    name, _, body = text.partition(":")
    top = {f.name: getattr(base, f.name) for f in fields(base) if f.name != "tdm"}
    inner = {f.name: getattr(base.tdm, f.name) for f in fields(base.tdm)}
    over, tdm, seed = {}, {}, None
    # values as parse_settings reads them (JSON, else a string): fake_lr=3e-5 is a number
    # also where the default is None
    for key, value in parse_settings(body.replace(",", ";")).items():
        if key == "seed":
            seed = int(value)
        elif key in top or key in inner:
            default = top[key] if key in top else inner[key]
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                value = type(default)(value)
            (over if key in top else tdm)[key] = value
        else:
            raise SystemExit(f"variant {name!r}: {key!r} is not a [turbo] or [turbo.tdm] key")
    if "mode" in tdm and "fake_updates" not in tdm:
        tdm["fake_updates"] = None  # the mode's own ratio (DMD2: 5 fake updates per step)
    settings = replace(base, **over, tdm=replace(base.tdm, **tdm))
    if settings.tdm.student_steps not in settings.eval_steps:
        settings = replace(settings, eval_steps=sorted({*settings.eval_steps,
                                                        settings.tdm.student_steps}))  # fmt: skip
    return name, settings, seed


def step_seconds(run: Path, stage: str = "turbo") -> dict[int, float]:
    """Step -> the summed step time up to it (s), from a run's metrics."""
    from krea2.trainer import read_metrics

    rows = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")
            if r.get("kind") == "train" and r.get("stage") == stage}  # fmt: skip
    total, out = 0.0, {}
    for step in sorted(rows):
        total += rows[step].get("step_time", 0.0)
        out[step] = total
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", type=Path, required=True, help="a finished full demo's --out")
    ap.add_argument("--work", type=Path, help="default: DEMO/turbo-proof")
    ap.add_argument("--variant", action="append", help=f"NAME:key=value,... (default {VARIANTS})")
    ap.add_argument("--print-only", action="store_true", help="print the table, write nothing")
    args = ap.parse_args()
    from krea2.curate.shapes import concept_scene, eval_prompt
    from krea2.infra.checkpoint_layout import scan_checkpoints
    from krea2.pipeline.chain import load_model
    from krea2.pipeline.config import load_demo_config
    from krea2.pipeline.evaluation import demo_concepts
    from krea2.pipeline.turbo_stage import free_prompts, measure, teacher_scale, train_student

    start = time.perf_counter()
    demo, cfg = args.demo.resolve(), load_demo_config(False, None, [])
    work = (args.work or demo / "turbo-proof").resolve()
    split, held = demo_concepts(cfg)
    prompts, targets = [eval_prompt(c) for c in held], [concept_scene(c) for c in held]
    chain = json.loads((demo / "stages" / "chain.json").read_text())["result"]["models"]["raw"]
    teacher = load_model(chain["record"])
    ev = cfg.eval
    scale = teacher_scale(cfg.turbo, ev.cfg)  # every variant is measured against this w
    cached = {"no_cfg": chain["no_cfg"]["samples"]}
    if scale == ev.cfg:
        cached["cfg"] = chain["cfg"]["samples"]
    results: dict[str, Any] = {}
    budget = None
    for text in args.variant or VARIANTS:
        name, s, seed = parse_variant(text, cfg.turbo)
        t = time.perf_counter()
        # DMD2 keeps every checkpoint: it is read at TDM's wall clock, not at its end
        keep = 1000 if s.tdm.mode.value == "dmd2" else 2
        student = train_student(s, teacher, work, [eval_prompt(c) for c in split.train], seed,
                                name, keep_last=keep)  # fmt: skip
        trained = time.perf_counter() - t
        clock = step_seconds(Path(student[0].run_dir))
        at = None
        if s.tdm.mode.value == "dmd2" and budget is not None:  # equal wall clock
            root = Path(student[0].run_dir) / "checkpoints" / "turbo"
            done = [e.step for e in scan_checkpoints(root) if e.complete]
            saved = [k for k in done if clock.get(k, 0) <= budget]
            at = max(saved) if saved else None
        r = measure(s, teacher, student, work / name, prompts, targets, list(ev.seeds),
                    ev.steps, scale, cached, student_step=at, teacher_work=work / "teacher",
                    speed=name == "tdm-seed0", free=free_prompts(held))  # fmt: skip
        if name == "tdm-seed0":
            budget = max(clock.values(), default=None)
        r.pop("per_image")
        # the run's own summed step time up to the step read (a rerun finds it trained)
        spent = clock.get(at) if at is not None else max(clock.values(), default=trained)
        results[name] = r | {"train_seconds": spent,
                             "step_seconds": clock,
                             "read_at_step": at, "seed": seed}  # fmt: skip
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    res = {"variants": results, "prompts": len(prompts), "seeds": list(ev.seeds),
           "teacher_steps": ev.steps, "cfg": scale,
           "seconds": time.perf_counter() - start}  # fmt: skip
    print(markdown(res))
    if args.print_only:
        return
    write_results("turbo-proof", res, markdown(res))
    print("wrote benchmarks/results/turbo-proof.json and its docs/benchmarks.md section")


def _d(r: dict, name: str) -> str:
    d = r["deltas"][name]
    return f"{d['delta']:+.3f} ± {d['se']:.3f}"


def markdown(res: dict) -> str:
    rows = []
    for name, r in res["variants"].items():
        m, keys, div = r["measures"], r["keys"], r["diversity"]
        st = m[keys["student"]]
        held = [k for k in CHECKS if r["checks"].get(k, {}).get("holds")]
        at = f" (step {r['read_at_step']})" if r.get("read_at_step") is not None else ""
        rows.append([
            name + at, f"{st['steps']}", f"{st['shapes_eval']:.3f}",
            _d(r, f"S{st['steps']} - T{res['teacher_steps']}"),
            _d(r, f"S{st['steps']} - T{st['steps']}"),
            _d(r, f"S{st['steps']} - T{res['teacher_steps']} no CFG"),
            ", ".join(f"{div['student'][k] / max(div['teacher'][k], 1e-9):.2f}"
                      for k in ("position", "size", "background")),
            f"{r['train_seconds']:.0f}", ", ".join(held) or "none",
        ])  # fmt: skip
    first = next(iter(res["variants"].values()))
    t = first["measures"][first["keys"]["teacher"]]
    t0 = first["measures"][first["keys"]["teacher_no_cfg"]]
    sp = first.get("speed") or {}
    speed = (
        f" Speed (tdm-seed0, per image): the student {sp['speedup_vs_cfg']:.1f}x faster than "
        f"the teacher with CFG ({sp['nfe_ratio_vs_cfg']:g}x fewer evaluations), "
        f"{sp['speedup_vs_no_cfg']:.1f}x than without ({sp['nfe_ratio_vs_no_cfg']:g}x)."
        if sp
        else ""
    )
    return (
        "## Turbo: TDM from the demo's raw model (`benchmarks/turbo_proof.py`)\n\n"
        f"TDM students of the demo's raw model; teacher at {res['teacher_steps']} steps: "
        f"ShapesEval {t['shapes_eval']:.3f} with CFG {res['cfg']:g} (T), "
        f"{t0['shapes_eval']:.3f} without (T₀). {res['prompts']} held-out prompts × "
        f"{len(res['seeds'])} seeds; Δ ± the paired standard error over the prompts; "
        "spread ×: on prompts naming only a colour and a shape, 16 seeds each, the spread of "
        "what the verifier detects (position, size, background) over the teacher's; checks: "
        "the must-shows that hold (docs/rl.md says each bound)."
        + speed
        + "\n\n"
        + table(
            [
                "variant",
                "student steps",
                "ShapesEval",
                "S − T",
                "S − T same steps",
                "S − T₀",
                "spread ×",
                "train s",
                "checks holding",
            ],
            rows,
        )
        + f"\n\n{res['seconds']:.0f} s in all."
    )


if __name__ == "__main__":
    main()
