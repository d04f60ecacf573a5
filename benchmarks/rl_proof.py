"""ShapesWorld proof of preference optimization: pretrain a toy DiT, rank its own samples
into pairs with the rubric + artifact rewards, run DPO and STPO from the same start, and
compare them on held-out prompts (ShapesEval, the artifact reward, high-frequency energy
relative to the pretrained model) and by their likelihood-gap curves.

    uv run --frozen python benchmarks/rl_proof.py [--quick] [--work DIR]

Writes benchmarks/results/rl-proof.json and the ``rl-proof`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

# Python puts this script's folder first on sys.path, where benchmarks/queue.py would shadow
# the standard library's queue; drop it and load report by path (as benchmarks/trainer.py).
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("report", HERE / "report.py")
_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_report)
table, write_results = _report.table, _report.write_results

from krea2.curate import Sample, export_shards, shapes  # noqa: E402
from krea2.rl.preference import (  # noqa: E402
    PreferenceConfig,
    export_pair_shards,
    generate_pairs,
    high_frequency_energy,
    train_preference,
)
from krea2.rl.rewards import ShapesRubricReward, WeightedSum, train_artifact_reward  # noqa: E402
from krea2.trainer import load_job, read_metrics, run_job, sample_stage  # noqa: E402

WORLD = dict(
    max_objects=1,
    shapes=("circle", "square", "triangle"),
    sizes=("large",),
    backgrounds=("solid",),
    background_colors=("black", "dark gray"),
)
MODEL = """
[model]
name = "toy"
[model.overrides]
width = 96
depth = 3
mlp_hidden = 384
time_dim = 64
text_dim = 32
text_mlp_hidden = 128
[text]
max_tokens = 16
[parallel]
threads = 2
[data]
workers = 0
"""


HEADERS = [
    "model",
    "ShapesEval",
    "artifact reward",
    "HF energy / pretrained",
    "winner gap (end)",
    "winner gap (max)",
    "loser gap (end)",
    "accuracy",
]


def scenes(n: int, seed: int, held: set, want_held: bool) -> list:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        s = shapes.sample_scene(rng, **WORLD)
        o = s.objects[0]
        if ((o.color, o.shape, o.cell) in held) == want_held:
            out.append(s)
    return out


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def pretrain(work: Path, train_scenes: list, steps: int) -> Path:
    samples = (
        Sample(key=f"s{i}", data=png(shapes.render(s, 32, 32)), captions=shapes.captions(s))
        for i, s in enumerate(train_scenes)
    )
    export_shards(samples, work / "train", stage="p32", side=32, seed=0, batch_size=32)
    job = work / "pretrain.toml"
    job.write_text(f"""run_dir = "{work / "pretrain"}"
seed = 0
{MODEL}
[checkpoint]
every = 0
[observe]
log_every = 50
[[stages]]
name = "p32"
data = ["{work / "train"}"]
steps = {steps}
batch_size = 32
lr = 3e-3
caption_weights = {{ medium = 0.8, short = 0.2 }}
schedule = {{ warmup_steps = 50, decay_ratio = 0.2 }}
""")
    if not (work / "pretrain" / "checkpoints" / "p32.done").exists():
        run_job(job, [], resume=(work / "pretrain").exists())
    return job


def preference_job(work: Path, name: str, shards: Path, steps: int) -> Path:
    job = work / f"{name}.toml"
    job.write_text(f"""run_dir = "{work / name}"
seed = 0
{MODEL}
[checkpoint]
every = 0
[observe]
log_every = 5
[stability]
warmup_steps = 100000
[[stages]]
name = "preference"
data = ["{shards}"]
init_from = "{work / "pretrain" / "checkpoints" / "p32"}"
steps = {steps}
batch_size = 16
lr = 1e-4
caption_dropout = 0.0
schedule = {{ warmup_steps = 10, decay_ratio = 0.0 }}
""")
    return job


def evaluate(job: Path, prompts: list[str], rubric, artifact, seeds=(0, 1)) -> dict:
    images = sample_stage(load_job(job), 0, prompts, list(seeds), 16, 2.0)
    flat = images.reshape(-1, *images.shape[2:])
    reps = [p for p in prompts for _ in seeds]
    return {
        "shapes_eval": float(np.mean(rubric(flat, reps).scores)),
        "artifact": float(np.mean(artifact(flat, reps).scores)),
        "hf_energy": high_frequency_energy(flat),
        "grid": images[:6, 0],
    }


def curves(run: Path) -> dict[str, list]:
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    keys = ("step", "loss", "winner_gap", "loser_gap", "margin", "accuracy", "step_time")
    return {k: [r[k] for r in rows] for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--work", type=Path, default=Path("/tmp/krea2-rl-proof"))
    args = ap.parse_args()
    q = args.quick
    work = args.work / ("quick" if q else "full")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    combos = sorted({(c, s, k) for c in shapes.COLORS for s in WORLD["shapes"] for k in range(9)})
    rng = np.random.default_rng(123)
    held = {combos[i] for i in rng.choice(len(combos), 24, replace=False)}
    pre_steps, pref_steps = (150, 30) if q else (900, 150)
    job = pretrain(work, scenes(4096, 0, held, False), pre_steps)
    t_pre = time.perf_counter() - t0
    rubric = ShapesRubricReward(ocr=False)
    artifact = train_artifact_reward(n=400, seed=0, epochs=200)
    reward = WeightedSum({"rubric": (rubric, 1.0), "artifact": (artifact, 0.5)})
    train_prompts = [shapes.captions(s)["medium"] for s in scenes(24 if q else 96, 7, held, False)]
    pairs = generate_pairs(load_job(job), 0, train_prompts, reward, work / "samples",
                           samples_per_prompt=4, steps=16, cfg_scale=2.0)  # fmt: skip
    shards = work / "pair-shards"
    for old in shards.glob("*.parquet"):
        old.unlink()
    export_pair_shards(pairs, shards, side=32, pairs_per_batch=8)
    t_pairs = time.perf_counter() - t0 - t_pre
    eval_prompts = [shapes.captions(s)["medium"] for s in scenes(12 if q else 32, 1, held, True)]
    results: dict = {"pretrained": evaluate(job, eval_prompts, rubric, artifact)}
    timings = {"pretrain_s": t_pre, "pairs_s": t_pairs}
    objectives = {"dpo": PreferenceConfig(kind="dpo", beta=500.0),
                  "stpo": PreferenceConfig(kind="stpo", beta=500.0)}  # fmt: skip
    for name, pref in objectives.items():
        t1 = time.perf_counter()
        pj = preference_job(work, name, shards, pref_steps)
        train_preference(pj, pref, resume=(work / name / "checkpoints").exists())
        timings[f"{name}_s"] = time.perf_counter() - t1
        results[name] = {
            **evaluate(pj, eval_prompts, rubric, artifact),
            "curves": curves(work / name),
        }
    base_hf = results["pretrained"]["hf_energy"]
    grids = {k: v.pop("grid") for k, v in results.items()}
    for v in results.values():
        v["hf_energy_ratio"] = v["hf_energy"] / base_hf
    strip = np.concatenate([np.concatenate(list(g), axis=1) for g in grids.values()], axis=0)
    Image.fromarray(strip).resize((strip.shape[1] * 3, strip.shape[0] * 3), 0).save(
        work / "grids.png"
    )
    total = time.perf_counter() - t0
    summary = {
        "pairs": len(pairs),
        "timings_s": timings | {"total_s": total},
        "results": results,
        "settings": {
            "pretrain_steps": pre_steps,
            "preference_steps": pref_steps,
            "eval_prompts": len(eval_prompts),
            "quick": q,
            "objectives": {k: str(v) for k, v in objectives.items()},
        },
    }
    rows = []
    for name, r in results.items():
        c = r.get("curves")
        rows.append([
            name,
            f"{r['shapes_eval']:.3f}",
            f"{r['artifact']:.3f}",
            f"{r['hf_energy_ratio']:.3f}",
            f"{c['winner_gap'][-1]:+.5f}" if c else "",
            f"{max(c['winner_gap']):+.5f}" if c else "",
            f"{c['loser_gap'][-1]:+.5f}" if c else "",
            f"{c['accuracy'][-1]:.2f}" if c else "",
        ])  # fmt: skip
    md = (
        "## Preference optimization on ShapesWorld (`benchmarks/rl_proof.py`)\n\n"
        f"Toy DiT pretrained {pre_steps} steps; {len(pairs)} on-policy pairs (4 samples per "
        "prompt, ranked by rubric + 0.5 x artifact reward); DPO and STPO (beta 500) "
        f"{pref_steps} steps each from the same start; {len(eval_prompts)} held-out prompts "
        "x 2 seeds. Gaps are e - e_ref (per-pixel velocity MSE; > 0: likelihood fell), the "
        "last logged step and the largest over the run.\n\n"
        + table(HEADERS, rows)
        + f"\n\nWall time: {total / 60:.1f} min ("
        + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())
        + ").\nCommand: `uv run --frozen python benchmarks/rl_proof.py"
        + (" --quick`." if q else "`.")
    )
    print(json.dumps(summary["results"], indent=1, default=str)[:4000])
    write_results("rl-proof-quick" if q else "rl-proof", summary, md)


if __name__ == "__main__":
    main()
