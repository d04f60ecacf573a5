"""Demo stage ``turbo``: raw distilled by TDM into a few-step, CFG-free student (Turbo),
measured against its teacher at 1, 2 and 4 steps (and the teacher at 20).

The stage trains ``turbo`` after raw's stage in a run of its own
(:func:`krea2.rl.distill.distill_job`: the objective ``tdm`` on prompt shards of the
training concepts, the teacher raw itself, CFG in its settings), then samples the held-out
prompts with ``[eval]``'s seeds: the student at each of ``eval_steps`` without CFG, the
teacher at each with ``[eval]``'s CFG and without, and at ``[eval]``'s step count (T20,
the chain's raw samples, reused). It reports ShapesEval and all-correct per (model, steps,
CFG), the paired differences the issue's must-shows name (S4 − T20, S4 − T4, S4 − T20₀),
the spread of what the verifier detects over seeds (position, size, background: no
collapse), saturation and background noise against T20, and sampling speed per image.
Everything is kept under ``work``; a rerun resumes the training and reuses the samples.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from krea2.curate.shapes import Scene
from krea2.pipeline.config import TurboStageSettings
from krea2.pipeline.evaluation import paired_delta
from krea2.trainer import JobConfig

STAGE = "turbo"
WHAT = "distil raw by TDM into a few-step student without CFG: Turbo"


def teacher_scale(s: TurboStageSettings, eval_cfg: float) -> float:
    """The teacher's CFG scale (krea2's w) the stage compares with: the guidance the student
    is distilled from (``tdm.teacher_guidance`` − 1), or ``eval_cfg`` when that is none."""
    return s.tdm.krea_guidance or eval_cfg


def run_demo_stage(
    s: TurboStageSettings,
    teacher: tuple[JobConfig, int],
    work: Path,
    train_prompts: list[str],
    prompts: list[str],
    targets: list[Scene],
    seeds: list[int],
    teacher_steps: int,
    cfg_scale: float,
    cached: dict[str, str],
    free: list[str] | None = None,
) -> dict:
    """Distil stage ``teacher[1]`` of job ``teacher[0]`` and measure student and teacher
    (module docstring) on ``prompts`` x ``seeds``; ``cached``: ``"cfg"``/``"no_cfg"`` ->
    the teacher's ``.npy`` samples at ``teacher_steps`` steps with CFG ``cfg_scale`` and
    without (the chain's); ``free``: the no-collapse probe's prompts. Returns the
    JSON-able result."""
    t = time.perf_counter()
    student = train_student(s, teacher, work, train_prompts)
    seconds = time.perf_counter() - t
    result = measure(s, teacher, student, work, prompts, targets, seeds, teacher_steps,
                     cfg_scale, cached, free=free)  # fmt: skip
    result["seconds"]["train"] = seconds
    return result


def train_student(
    s: TurboStageSettings,
    teacher: tuple[JobConfig, int],
    work: Path,
    train_prompts: list[str],
    seed: int | None = None,
    name: str = "tdm",
    keep_last: int = 2,
) -> tuple[JobConfig, int]:
    """Train (or resume, or find finished) the student of ``s`` in run ``work/name``
    (``seed``: the run's draws, None: the teacher job's; ``keep_last`` checkpoints kept);
    returns (its job, stage index)."""
    from dataclasses import replace

    from krea2.infra.atomic import publish_dir
    from krea2.rl.distill import distill_job, train_distill
    from krea2.rl.online import export_prompt_shards

    job0, index = teacher
    work.mkdir(parents=True, exist_ok=True)
    shards = work / "prompt-shards"
    side = job0.stages[index].resolution
    stride = -(-len(train_prompts) // s.max_train_prompts)  # evenly over the concepts
    pool = list(train_prompts[::stride])
    publish_dir(shards, lambda tmp: export_prompt_shards(pool, tmp, side, s.prompts_per_step))
    job = distill_job(job0, index, work / name, shards, s.tdm, s.steps, s.prompts_per_step,
                      s.lr, s.checkpoint_every, keep_last=keep_last)  # fmt: skip
    job = job if seed is None else replace(job, seed=seed)
    train_distill(job0, index, job)
    return job, len(job.stages) - 1


def measure(
    s: TurboStageSettings,
    teacher: tuple[JobConfig, int],
    student: tuple[JobConfig, int],
    work: Path,
    prompts: list[str],
    targets: list[Scene],
    seeds: list[int],
    teacher_steps: int,
    cfg_scale: float,
    cached: dict[str, str],
    student_step: int | None = None,
    teacher_work: Path | None = None,
    speed: bool = True,
    free: list[str] | None = None,
) -> dict:
    """The student (its checkpoint of ``student_step``, None: the newest) at each of
    ``s.eval_steps`` without CFG against the teacher at each with and without CFG and at
    ``teacher_steps`` (``cached``, as :func:`run_demo_stage`); samples kept under ``work``
    (the teacher's under ``teacher_work``, default ``work``, so variants share them);
    ``speed``: time the sampling too; ``free``: the no-collapse probe's prompts
    (:func:`free_prompts`), each sampled with :data:`DIVERSITY_SEEDS` by the student and
    the teacher at ``teacher_steps``. Returns the JSON-able result."""
    t = time.perf_counter()
    teacher_work = teacher_work or work
    runs = [("student", student, k, 0.0) for k in s.eval_steps]
    runs += [("teacher", teacher, k, scale) for k in s.eval_steps for scale in (cfg_scale, 0.0)]
    runs += [("teacher", teacher, teacher_steps, scale) for scale in (cfg_scale, 0.0)]
    at = "" if student_step is None else f"@{student_step}"
    measures = {}
    for who, model, steps, scale in runs:
        key = _key(who, steps, scale)
        given = cached.get("cfg" if scale else "no_cfg") if steps == teacher_steps else None
        if who == "teacher":
            path = Path(given) if given else teacher_work / f"{key}.npy"
            step = None
        else:
            path, step = work / f"{key}{at}.npy", student_step
        measures[key] = _measure(model, step, path, prompts, targets, seeds, steps, scale)
        measures[key] |= {"who": who, "steps": steps, "cfg": scale}
    k = s.tdm.student_steps
    s_k, t_k = f"student-{k}", _key("teacher", k, cfg_scale)
    t_full, t_plain = _key("teacher", teacher_steps, cfg_scale), _key("teacher", teacher_steps, 0)
    deltas = {
        f"S{k} - T{teacher_steps}": (s_k, t_full),
        f"S{k} - T{k}": (s_k, t_k),
        f"S{k} - T{teacher_steps} no CFG": (s_k, t_plain),
        f"T{teacher_steps} - T{teacher_steps} no CFG": (t_full, t_plain),
        f"T{teacher_steps} - T{k}": (t_full, t_k),
    }
    job = student[0]
    result: dict[str, Any] = {
        "measures": {
            key: {f: v for f, v in m.items() if f != "per_image"} for key, m in measures.items()
        },
        "per_image": {key: m["per_image"] for key, m in measures.items()},
        "deltas": {
            name: paired_delta(measures[a]["per_image"], measures[b]["per_image"])
            for name, (a, b) in deltas.items()
        },
        "keys": {"student": s_k, "teacher_k": t_k, "teacher": t_full, "teacher_no_cfg": t_plain},
        "curves": curves(Path(job.run_dir)),
        "model": {"run": str(job.run_dir), "stage": job.stages[-1].name},
        "settings": asdict(s)
        | {
            "teacher_steps": teacher_steps,
            "cfg": cfg_scale,
            "seeds": list(seeds),
            "prompts": len(prompts),
            "student_step": student_step,
        },
        "seconds": {"eval": time.perf_counter() - t},
    }
    if speed:
        result["speed"] = _speed(s, teacher, student, prompts, teacher_steps, cfg_scale)
    if free:
        result["diversity"] = {
            "prompts": list(free),
            "student": _diversity(student, student_step, work / f"free-student{at}.npy", free,
                                  s.tdm.student_steps, 0.0),
            "teacher": _diversity(teacher, None, teacher_work / "free-teacher.npy", free,
                                  teacher_steps, cfg_scale),
        }  # fmt: skip
    result["checks"] = checks(result)
    return result


def _key(who: str, steps: int, scale: float) -> str:
    return f"{who}-{steps}" + (f"-cfg{scale:g}" if scale else "")


def _measure(model, step, path: Path, prompts, targets, seeds, steps: int, scale: float) -> dict:  # type: ignore[no-untyped-def]
    """ShapesEval, all-correct, per-image scores, spread, saturation and background noise of
    ``model``'s samples (its checkpoint of ``step``, None: the newest; cached in ``path``)."""
    from krea2.curate.shapes import shapes_eval
    from krea2.infra.atomic import cached_array
    from krea2.rl.online import background_noise
    from krea2.trainer import sample_stage

    images = cached_array(
        path, lambda: sample_stage(*model, list(prompts), list(seeds), steps, scale, step=step)
    )
    score = shapes_eval(images, list(targets))
    flat = images.reshape(-1, *images.shape[2:])
    return {
        "shapes_eval": score.score,
        "all_correct": score.all_correct,
        "per_image": score.per_image,
        "spread": spread_of_detections(images),
        "saturation": float(saturation(flat).mean()),
        "bg_noise": float(background_noise(flat).mean()),
        "samples": str(path),
    }


DIVERSITY_SEEDS = list(range(100, 116))  # 16 seeds per free prompt


def _diversity(model, step, path: Path, prompts, steps: int, scale: float) -> dict:  # type: ignore[no-untyped-def]
    """:func:`spread_of_detections` of ``model``'s samples of ``prompts`` x
    :data:`DIVERSITY_SEEDS` (cached in ``path``)."""
    from krea2.infra.atomic import cached_array
    from krea2.trainer import sample_stage

    images = cached_array(path, lambda: sample_stage(
        *model, list(prompts), DIVERSITY_SEEDS, steps, scale, step=step))  # fmt: skip
    return spread_of_detections(images)


def saturation(images: np.ndarray, floor: int = 48) -> np.ndarray:
    """Mean HSV saturation (max − min) / max per image of uint8 [N, H, W, 3] over its
    foreground, the pixels whose max channel is at least ``floor`` (the dark background's
    faint noise would otherwise read as fully saturated), in [0, 1]; 0 with none."""
    x = images.astype(np.float32)
    hi, lo = x.max(-1), x.min(-1)
    fg = hi >= floor
    sat = np.where(fg, (hi - lo) / np.maximum(hi, 1.0), 0.0).sum((1, 2))
    return sat / np.maximum(fg.sum((1, 2)), 1)


def free_prompts(concepts: list, most: int = 8) -> list[str]:
    """Short prompts that name only a colour and a shape (``"A blue square"``, the short
    caption format the DiT trains on), leaving position, size and background free: the
    no-collapse probe's prompts, from the held-out concepts (colour, shape, cell)."""
    out: list[str] = []
    for colour, shape, _ in concepts:
        prompt = f"A {colour} {shape}"
        if prompt not in out:
            out.append(prompt)
    return out[:most]


def spread_of_detections(images: np.ndarray) -> dict[str, float]:
    """How much what the verifier detects varies over seeds, per prompt then averaged over
    prompts, of uint8 [P, S, H, W, 3]: the largest object's centroid (``position``, std of
    x and y as fractions of the side, their mean), its size (``size``, std of √area / side)
    and the background (``background``, std of the border's median colour / 255, mean over
    channels). A collapsed few-step student draws the same picture for every seed."""
    from krea2.curate.shapes import detect_objects

    side = images.shape[2]
    rows: dict[str, list[float]] = {"position": [], "size": [], "background": []}
    for per_prompt in images:
        pos, size, bg = [], [], []
        for im in per_prompt:
            border = np.concatenate([im[0], im[-1], im[:, 0], im[:, -1]])
            bg.append(np.median(border, 0) / 255.0)
            found = detect_objects(im)
            if found:
                big = max(found, key=lambda o: o.area)
                pos.append(np.asarray(big.centroid) / side)
                size.append(np.sqrt(big.area) / side)
        if len(pos) > 1:
            rows["position"].append(float(np.std(pos, 0).mean()))
            rows["size"].append(float(np.std(size)))
        rows["background"].append(float(np.std(bg, 0).mean()))
    return {k: float(np.mean(v)) if v else 0.0 for k, v in rows.items()}


def _speed(s, teacher, student, prompts, teacher_steps: int, cfg_scale: float) -> dict:  # type: ignore[no-untyped-def]
    """Seconds per image of each model's sampling (loaded first, then timed alone) on
    ``s.speed_prompts`` prompts x 1 seed: T at ``teacher_steps`` with and without CFG, the
    student at its own steps (the fastest of 3 interleaved repeats); and the ratios beside
    the network-evaluation ratios."""
    from krea2.trainer import load_stage_module, sample_module

    chosen = list(prompts[: s.speed_prompts])
    k = s.tdm.student_steps
    runs = {
        "teacher_cfg": (teacher, teacher_steps, cfg_scale),
        "teacher_no_cfg": (teacher, teacher_steps, 0.0),
        "student": (student, k, 0.0),
    }
    modules = {name: load_stage_module(*model) for name, (model, _, _) in runs.items()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(3):  # interleaved repeats, the fastest of each: less noise from the machine
        for name, ((job, index), steps, scale) in runs.items():
            sample_module(job, index, modules[name], chosen[:1], [0], 1, scale)  # warm up
            t = time.perf_counter()
            sample_module(job, index, modules[name], chosen, [0], steps, scale)
            best[name] = min(best[name], time.perf_counter() - t)
    out: dict[str, Any] = {f"{n}_s_per_image": sec / len(chosen) for n, sec in best.items()}
    out["speedup_vs_cfg"] = out["teacher_cfg_s_per_image"] / out["student_s_per_image"]
    out["speedup_vs_no_cfg"] = out["teacher_no_cfg_s_per_image"] / out["student_s_per_image"]
    out["nfe_ratio_vs_cfg"] = 2 * teacher_steps / k  # CFG: two evaluations a step
    out["nfe_ratio_vs_no_cfg"] = teacher_steps / k
    return out


def curves(run_dir: Path) -> dict[str, list]:
    """The turbo stage's logged train rows: ``step``, ``loss`` (the student's),
    ``fake_loss``, ``teacher_fake_gap``, ``dm_grad_norm`` and ``x0_rms``."""
    from krea2.trainer import read_metrics

    keys = ("step", "loss", "fake_loss", "teacher_fake_gap", "dm_grad_norm", "x0_rms")
    path = run_dir / "metrics.jsonl"
    rows = {r["step"]: r for r in (read_metrics(path) if path.exists() else [])
            if r.get("kind") == "train" and r.get("stage") == STAGE}  # fmt: skip
    return {k: [rows[i].get(k) for i in sorted(rows)] for k in keys}


def checks(result: dict) -> dict[str, dict]:
    """The issue's must-shows on this run: each ``{"holds": bool, "why": str}``."""
    m, d, keys, sp = result["measures"], result["deltas"], result["keys"], result.get("speed")
    s_, tk, tf, t0 = (m[keys[k]] for k in ("student", "teacher_k", "teacher", "teacher_no_cfg"))
    a, b, c = s_["shapes_eval"], tf["shapes_eval"], tk["shapes_eval"]
    out = {
        "quality": (a >= b - 0.03, f"S {a:.3f} >= T {b:.3f} - 0.03"),
        "beats_fewer_teacher_steps": (
            a - c >= 0.5 * (b - c),
            f"S - Tk {a - c:+.3f} >= ½(T - Tk) {0.5 * (b - c):+.3f}",
        ),
        "no_drift": (
            abs(s_["saturation"] - tf["saturation"]) <= 0.1
            and s_["bg_noise"] <= max(1.5 * tf["bg_noise"], tf["bg_noise"] + 0.5),
            f"saturation {s_['saturation']:.3f} vs T {tf['saturation']:.3f} (within 0.1), "
            f"background noise {s_['bg_noise']:.2f} vs T {tf['bg_noise']:.2f} "
            "(at most 1.5x or +0.5)",
        ),
    }
    if (div := result.get("diversity")) is not None:
        # a teacher that never varies a feature leaves nothing to collapse: ratio 1
        ratio = {f: div["student"][f] / v if v > 0 else 1.0 for f, v in div["teacher"].items()}
        out["no_collapse"] = (
            min(ratio.values()) >= 0.8,
            "spread over 16 seeds / the teacher's: "
            + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items())
            + " (>= 0.8)",
        )
    if sp is not None:
        out["speed_vs_cfg"] = (
            sp["speedup_vs_cfg"] >= 0.8 * sp["nfe_ratio_vs_cfg"],
            f"{sp['speedup_vs_cfg']:.1f}x >= 0.8 x {sp['nfe_ratio_vs_cfg']:g}",
        )
    if tf["shapes_eval"] > t0["shapes_eval"]:
        gain = tf["shapes_eval"] - t0["shapes_eval"]
        got = d[next(n for n in d if n.endswith("no CFG") and n.startswith("S"))]["delta"]
        out["guidance_distilled"] = (got >= 0.5 * gain, f"S - T0 {got:+.3f} >= ½ {gain:.3f}")
    return {k: {"holds": bool(h), "why": why} for k, (h, why) in out.items()}
