"""gpu.py's ``rl`` part: the RL-without-CFG proof at a GPU budget, from a carried kit.

``benchmarks.rl_grpo_proof`` runs the demo's ``[rl]`` recipe, read from it (DiffusionNFT,
LoRA r8 at lr 3e-3, the rubric + 0.5 x artifact + shape-fidelity rewards by GDPO, the
hard-prompt pool drawn up to 4x, the old policy at EMA 0.5) for ``seeds`` training seeds
of ``steps`` iterations each, from the pretrained model in ``KIT/demo``
(``benchmarks.gpu_kit``), in a child process limited to ``timeout_s``. A run cut short is
reported at its last logged evaluation. The issue's target: held-out ShapesEval without
CFG >= 0.95, mean of 3 seeds.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# rl_grpo_proof sets these itself (per run or per variant), or they only size the demo's run
LEFT_TO_THE_PROOF = ("seed", "steps", "eval_every", "checkpoint_every", "window_size",
                     "window_start_max", "rewards", "weights")  # fmt: skip


def recipe_sets() -> list[str]:
    """The demo's ``[rl]`` table (``src/krea2/pipeline/recipes/demo.toml``: the stage's
    settings and its ``[rl.grpo]`` objective) as ``rl_grpo_proof --set`` items, read from the
    recipe so the proof runs what the demo runs; the reward weights as the proof's
    ``artifact_weight`` and ``shape_weight``."""
    from dataclasses import asdict

    from krea2.pipeline.config import load_demo_config

    rl = asdict(load_demo_config(False).rl)
    flat = {**{k: v for k, v in rl.items() if k != "grpo"}, **rl["grpo"]}
    weights = rl["grpo"]["weights"]
    flat |= {"artifact_weight": weights.get("artifact", 0.0),
             "shape_weight": weights.get("shape", 0.0)}  # fmt: skip
    left = set(LEFT_TO_THE_PROOF)
    kept = {k: v for k, v in flat.items()
            if k not in left and not k.startswith("eval_") and v is not None}  # fmt: skip
    return [f"{k}={json.dumps(getattr(v, 'value', v))}" for k, v in kept.items()]


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
    sets = [f"--set={kv}" for kv in (*recipe_sets(), f"steps={steps}", f"eval_every={eval_every}")]
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
