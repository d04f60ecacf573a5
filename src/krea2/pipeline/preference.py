"""Demo stages ``preference-stpo`` and ``preference-dpo``: the chain's SFT model
preference-tuned with STPO (the report's objective) and, as the ablation, Diffusion-DPO,
from the same start on the same on-policy pairs (``krea2.rl.preference``), measured on the
demo's held-out prompts against that start (the "pretrained" rows: the SFT model).

Both stages share one work directory (``OUT/preference``): the pairs, their shards, the
artifact reward's head and the pretrained model's evaluation are made once; each
objective's trainer run resumes from its checkpoint after an interruption.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from krea2.curate.shapes import Concept, concept_scene, eval_prompt
from krea2.pipeline.config import DemoConfig
from krea2.trainer import JobConfig

# The report's objective first, then the ablation; what each stage's banner says.
OBJECTIVES = {
    "stpo": "preference-tune the SFT model with STPO on on-policy pairs (the chain)",
    "dpo": "the ablation: Diffusion-DPO from the same start on the same pairs (a branch)",
}
# The comparison table (report.html, benchmarks/rl_proof.py): one row per model.
HEADERS = [
    "model",
    "ShapesEval",
    "artifact reward",
    "HF energy / pretrained",
    "winner gap (end)",
    "winner gap (max)",
    "loser gap (end)",
    "accuracy (end)",
]


def stage_name(objective: str) -> str:
    """The demo stage of ``objective``: ``preference-stpo`` or ``preference-dpo``."""
    return f"preference-{objective}"


def run_objective(
    cfg: DemoConfig,
    job: JobConfig,
    work: Path,
    objective: str,
    train: list[Concept],
    held_out: list[Concept],
) -> dict:
    """Preference-tune ``job``'s final pretraining stage (finished) with ``objective``
    (``stpo`` or ``dpo``) on pairs of the ``train`` concepts' prompts, ranked by the rubric
    alone (ties left out; the artifact reward, its head at ``work/artifact.npz``, is
    measured, not ranked by), sized by ``cfg.preference``; evaluated on the ``held_out``
    concepts' prompts and scenes.
    Resumable under ``work``. Returns ``krea2.rl.preference.preference_stage``'s result
    (JSON-able: curves, pretrained/tuned measures, samples as uint8 [P, S, H, W, 3]
    ``.npy`` paths, pairs, seconds, and ``note`` when there was no pair)."""
    from krea2.rl.preference import preference_stage, shapes_preference_reward

    # Weight 0: on the SFT model's samples the artifact head reads P(defect) 0.9-0.99 for
    # nearly all of them, so ranking rubric ties by it made half the pairs noise, and PO
    # lowered the artifact reward it was ranked by (docs/design/rl.md, "Which pairs").
    reward = shapes_preference_reward(work / "artifact.npz", artifact_weight=0.0)
    return preference_stage(
        job,
        len(job.stages) - 1,
        work,
        [eval_prompt(c) for c in train],
        [eval_prompt(c) for c in held_out],
        reward,
        objective,
        cfg.preference,
        eval_targets=[concept_scene(c) for c in held_out],
    )


def gap_stats(result: dict) -> dict[str, float] | None:
    """The likelihood gaps of a trained objective (e − e_ref, per-pixel velocity MSE; > 0:
    that image's likelihood fell): the winner's at the last logged step and its largest,
    the loser's at the last step, and the pair accuracy at the last step; None without a
    logged step (no pair, nothing trained)."""
    c = result["curves"]
    if not result["pairs"] or not c["step"]:
        return None
    return {
        "winner_gap_end": c["winner_gap"][-1],
        "winner_gap_max": max(c["winner_gap"]),
        "loser_gap_end": c["loser_gap"][-1],
        "accuracy_end": c["accuracy"][-1],
    }


def comparison_rows(results: Mapping[str, dict]) -> list[list[str]]:
    """Rows of :data:`HEADERS`: the pretrained model, then each objective in ``results``
    (``{objective: result}``); an objective that had no pair reads "no pair: not trained"."""
    pre = next(iter(results.values()))["pretrained"]
    rows = [["pretrained", f"{pre['shapes_eval']:.3f}", _opt(pre["artifact"]), "1.000",
             "", "", "", ""]]  # fmt: skip
    for kind, r in results.items():
        gaps = gap_stats(r)
        if gaps is None:
            rows.append([kind.upper(), "no pair: not trained", "", "", "", "", "", ""])
            continue
        t = r["tuned"]
        rows.append([
            kind.upper(), f"{t['shapes_eval']:.3f}", _opt(t["artifact"]),
            f"{r['hf_energy_ratio']:.3f}", f"{gaps['winner_gap_end']:+.5f}",
            f"{gaps['winner_gap_max']:+.5f}", f"{gaps['loser_gap_end']:+.5f}",
            f"{gaps['accuracy_end']:.2f}",
        ])  # fmt: skip
    return rows


def _opt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def summary(results: Mapping[str, dict]) -> dict:
    """summary.json's ``preference``: per objective its pairs, the pretrained and tuned
    measures (ShapesEval, by kind, reward, artifact, HF energy), the HF energy ratio, the
    gap statistics (:func:`gap_stats`, None when untrained), seconds and any note."""
    out = {}
    for kind, r in results.items():
        out[kind] = {
            "pairs": r["pairs"],
            "pretrained": r["pretrained"],
            "tuned": r["tuned"],
            "hf_energy_ratio": r["hf_energy_ratio"],
            "gaps": gap_stats(r),
            "seconds": r["seconds"],
            **({"note": r["note"]} if r.get("note") else {}),
        }
    return out


def summary_line(objective: str, result: dict) -> str:
    """One terminal line: ShapesEval and artifact reward pretrained → tuned, the HF energy
    ratio and the winner's gap; or why nothing was trained."""
    pre, post = result["pretrained"], result["tuned"]
    gaps = gap_stats(result)
    head = f"{objective.upper():<4} "
    if gaps is None:
        return head + f"not trained: {result.get('note', 'no logged step')}"
    art = (
        f"  artifact {pre['artifact']:.3f} -> {post['artifact']:.3f}"
        if pre["artifact"] is not None and post["artifact"] is not None
        else ""
    )
    return (
        head + f"ShapesEval {pre['shapes_eval']:.3f} -> {post['shapes_eval']:.3f}{art}  "
        f"HF energy x{result['hf_energy_ratio']:.2f}  winner gap {gaps['winner_gap_end']:+.4f} "
        f"(max {gaps['winner_gap_max']:+.4f})  loser gap {gaps['loser_gap_end']:+.4f}  "
        f"{result['pairs']} pairs"
    )


def first_seed_rows(results: Mapping[str, dict], most: int = 8) -> list[tuple[str, np.ndarray]]:
    """(label, uint8 images [min(P, most), H, W, 3]) of the first eval seed: the pretrained
    model, then each objective that was trained (an untrained one's are the pretrained's)."""
    first = next(iter(results.values()))
    rows = [("pretrained", np.load(first["pretrained_samples"])[:most, 0])]
    rows += [
        (kind.upper(), np.load(r["samples"])[:most, 0])
        for kind, r in results.items()
        if gap_stats(r) is not None
    ]
    return rows
