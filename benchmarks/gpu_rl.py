"""gpu.py's ``rl`` part: the RL-without-CFG proof at a GPU budget, from a carried kit.

``benchmarks.rl_grpo_proof`` runs the demo's ``[rl]`` recipe (DiffusionNFT, LoRA r8 at
lr 3e-3, the rubric + 0.5 x artifact + shape-fidelity rewards by GDPO, the hard-prompt
pool drawn up to 4x, the old policy at EMA 0.5) for ``seeds`` training seeds of ``steps``
iterations each, from the pretrained model in ``KIT/demo`` (``benchmarks.gpu_kit``), in a
child process limited to ``timeout_s``. A run cut short is reported at its last logged
evaluation. The issue's target: held-out ShapesEval without CFG >= 0.95, mean of 3 seeds.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The demo's [rl] table (src/krea2/pipeline/recipes/demo.toml), as rl_grpo_proof --set keys.
RECIPE = (
    "lora_rank=8", "lr=0.003", "keep_unsolved=true", "hard_repeats=4", "max_train_prompts=64",
    "pool_samples=4", "prompts_per_step=8", "group_size=8", "sample_steps=8", "micro_batch=16",
    "inner_steps=1", "nft_old_decay=0.5", "nft_weighting=adaptive", "shape_weight=1.0",
    "artifact_weight=0.5", "aggregation=normalize_then_sum", "artifact_bound=0.9",
    "noise_bound=2.0",
)  # fmt: skip


def rl_proof(kit: Path, seeds: int, steps: int, eval_every: int, timeout_s: float) -> dict:
    """Run the proof; returns per seed the held-out ShapesEval without CFG (``scores``,
    ``None`` for a run that logged no evaluation), their ``mean``, the pretrained model's
    with and without CFG, and ``finished`` (every run done within ``timeout_s``)."""
    demo = kit / "demo"
    if not (demo / "run" / "checkpoints").is_dir():
        raise FileNotFoundError(
            f"{demo}: no pretrained model; pack one here with `python -m benchmarks.gpu_kit "
            f"--demo DIR --out {kit}` and carry it (run(..., carry=['{kit}']))"
        )
    work = Path(tempfile.mkdtemp(prefix="krea2-gpu-rl-"))
    names = [f"nft-s{s}" for s in range(seeds)]
    sets = [f"--set={kv}" for kv in (*RECIPE, f"steps={steps}", f"eval_every={eval_every}")]
    base = [sys.executable, "-m", "benchmarks.rl_grpo_proof", "--demo", str(demo),
            "--work", str(work), "--variants", ",".join(f"{n}:seed={s}" for s, n in
                                                         enumerate(names)), *sets]  # fmt: skip
    finished = True
    try:
        subprocess.run(base, cwd=HERE.parent, timeout=timeout_s, check=True)
    except subprocess.TimeoutExpired:
        finished = False  # report what the runs logged so far
        subprocess.run([*base, "--report-only"], cwd=HERE.parent, timeout=120, check=True)
    r = json.loads((HERE / "results" / "rl-grpo-proof.json").read_text())
    scores = [_score(r, n) for n in names]
    got = [s for s in scores if s is not None]
    return {"seeds": seeds, "steps": steps, "scores": scores,
            "mean": statistics.fmean(got) if got else None, "finished": finished,
            "pretrained": {k: r["pretrained"][k]["shapes_eval"] for k in ("no_cfg", "cfg")
                           if k in r["pretrained"]}}  # fmt: skip


def _score(r: dict, name: str) -> float | None:
    if name in r["results"]:
        return r["results"][name]["tuned"]["no_cfg"]["shapes_eval"]
    c = r.get("partial", {}).get(name)
    evals = [v for v in (c or {}).get("eval_shapes", []) if v is not None]
    return evals[-1] if evals else None
