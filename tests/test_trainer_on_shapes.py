"""Toy proof across packages: ShapesWorld shards from krea2.curate train a tiny DiT whose
held-out flow loss falls steadily and whose held-out samples are checked by the verifier.

Kept under 2 minutes; the longer run with its scores is ``benchmarks/trainer.py --proof``.
"""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import numpy as np
from PIL import Image

from krea2.curate import Sample, export_shards, shapes

SMALL_WORLD = dict(
    max_objects=1,
    shapes=("circle", "square", "triangle"),
    sizes=("large",),
    backgrounds=("solid",),
    background_colors=("black", "dark gray"),
)


def combo(scene) -> tuple:
    o = scene.objects[0]
    return (o.color, o.shape, o.cell)


def held_out_combos(n: int = 24, seed: int = 123) -> set[tuple]:
    """(color, shape, cell) combinations never shown in training."""
    rng = np.random.default_rng(seed)
    combos = sorted(
        {(c, s, k) for c in shapes.COLORS for s in SMALL_WORLD["shapes"] for k in range(9)}
    )
    return {combos[i] for i in rng.choice(len(combos), n, replace=False)}


def scenes(n: int, seed: int, held_out: set[tuple], want_held_out: bool) -> list:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        s = shapes.sample_scene(rng, **SMALL_WORLD)
        if (combo(s) in held_out) == want_held_out:
            out.append(s)
    return out


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def write_shapes_shards(out: Path, scene_list: list, side: int, batch: int, seed: int) -> None:
    samples = (
        Sample(
            key=f"shape-{seed}-{i}",
            data=png(shapes.render(s, side, side)),
            captions=shapes.captions(s),
            meta={"scene": shapes.captions(s)["json"]},
        )
        for i, s in enumerate(scene_list)
    )
    stats = export_shards(samples, out, stage=f"p{side}", side=side, seed=seed, batch_size=batch)
    assert stats.rows > 0 and stats.failed == 0


SMALL_DIT = """
[model.overrides]
width = 64
depth = 2
mlp_hidden = 256
time_dim = 64
text_dim = 32
text_mlp_hidden = 128
"""


def proof_job(
    root: Path,
    steps: int,
    batch: int,
    eval_every: int,
    prompts: list[str],
    model: str = SMALL_DIT,
    sample_steps: int = 20,
) -> Path:
    job = root / "job.toml"
    job.write_text(f"""
run_dir = "{root / "run"}"
seed = 0
[model]
name = "toy"
{model}
[text]
max_tokens = 24
[parallel]
threads = 2
[data]
workers = 0
[checkpoint]
every = 0
[observe]
log_every = 10
eval_every = {eval_every}
eval_batches = 2
sample_prompts = {json.dumps(prompts)}
sample_seeds = [0]
sample_steps = {sample_steps}
sample_cfg = 2.0
[[stages]]
name = "p32"
data = ["{root / "train"}"]
eval_data = ["{root / "eval"}"]
resolution = 32
steps = {steps}
batch_size = {batch}
caption_dropout = 0.1
[stages.caption_weights]
long = 0.2
medium = 0.4
short = 0.2
tags = 0.2
[stages.schedule]
warmup_steps = 30
decay_ratio = 0.2
""")
    return job


def score_samples(run: Path, eval_scenes: list) -> dict[str, float]:
    """Verifier sub-scores of the last sample grid (one image per held-out prompt)."""
    grid = sorted((run / "samples").glob("*.png"))[-1]
    img = np.asarray(Image.open(grid).convert("RGB"))
    n = len(eval_scenes)
    scale = img.shape[0] // (n * 34 + 2)
    small = img[::scale, ::scale]
    kinds: dict[str, list[float]] = {}
    for i, scene in enumerate(eval_scenes):
        y = 2 + i * 34
        tile = small[y : y + 32, 2:34]
        for k, v in shapes.verify(scene, np.ascontiguousarray(tile)).by_kind().items():
            kinds.setdefault(k, []).append(v)
    return {k: float(np.mean(v)) for k, v in kinds.items()}


def test_toy_dit_learns_shapesworld_from_curate_shards(tmp_path):
    from krea2.trainer.cli import run_job
    from krea2.trainer.observe import read_metrics

    held = held_out_combos()
    write_shapes_shards(tmp_path / "train", scenes(512, 0, held, False), 32, 16, seed=0)
    eval_scenes = scenes(32, 1, held, True)
    write_shapes_shards(tmp_path / "eval", eval_scenes, 32, 16, seed=1)
    prompts_scenes = eval_scenes[:4]
    prompts = [shapes.captions(s)["medium"] for s in prompts_scenes]
    job = proof_job(tmp_path, steps=80, batch=16, eval_every=20, prompts=prompts, sample_steps=8)
    run_job(job, [], False)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    evals = [r["eval_loss"] for r in rows if r["kind"] == "eval"]
    assert len(evals) == 4
    assert all(b < a for a, b in itertools.pairwise(evals)), evals  # steadily down
    assert evals[-1] < 0.7 * evals[0], evals
    scores = score_samples(tmp_path / "run", prompts_scenes)
    print("held-out eval loss", evals, "verifier", scores)
    assert set(scores) >= {"object", "position"}
