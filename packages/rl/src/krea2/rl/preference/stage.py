"""The demo's preference stage (report §4.4): on-policy pairs from the pretrained model,
ranked by a reward (rubric + artifact), then STPO or DPO from the same start, measured on
held-out prompts against the pretrained model.

Every step leaves its result under ``work`` and a rerun reuses it: the pairs
(``pairs.json``), their shards, the pretrained model's evaluation samples, each
objective's run (resumed from its newest checkpoint) and its final result
(``<objective>.json``). STPO and DPO called with one ``work`` share the pairs and the
pretrained evaluation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from krea2.infra.atomic import cached_array, publish_dir, write_json
from krea2.infra.errors import UserError
from krea2.rl.preference.loss import PreferenceConfig, PreferenceKind
from krea2.rl.preference.measures import high_frequency_energy
from krea2.rl.preference.shards import Pair
from krea2.rl.preference.stage_job import PREFERENCE_STAGE, preference_job
from krea2.rl.rewards import Reward
from krea2.trainer import JobConfig, link_finished

CURVE_KEYS = ("step", "loss", "winner_gap", "loser_gap", "margin", "accuracy")


@dataclass
class PreferenceStageSettings:
    """How big the preference stage is (a demo recipe's ``[preference]`` table).

    Pairs: up to ``max_train_prompts`` training prompts (evenly spread over those given),
    ``samples_per_prompt`` samples each (seeds ``pair_seed ..``), ranked into
    ``pairs_per_prompt`` pairs per prompt. Sampling (pairs and evaluation): ``sample_steps``
    Euler steps at CFG ``sample_cfg``; evaluation: every eval prompt x ``eval_seeds``.
    Training: ``steps`` steps of ``batch_size`` images (half as many pairs) at ``lr``
    (constant after ``warmup_steps``); the objective's ``beta`` (per-pixel velocity MSE
    units) and STPO's ``winner_hinge``, ``loser_cap``, ``loser_margin`` (docs/rl.md);
    ``caption_dropout``: the share of pairs trained with the empty caption (CFG's negative),
    so the unconditional branch follows the conditional one and CFG does not amplify the
    change (docs/rl.md)."""

    max_train_prompts: int = 64
    samples_per_prompt: int = 4
    pairs_per_prompt: int = 1
    pair_seed: int = 1000
    sample_steps: int = 20
    sample_cfg: float = 3.0
    eval_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 150
    batch_size: int = 16
    lr: float = 1e-4
    warmup_steps: int = 10
    beta: float = 5000.0
    winner_hinge: float = 1.0
    loser_cap: float = 0.1
    loser_margin: float = 0.01
    caption_dropout: float = 0.0
    log_every: int = 5
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        if self.samples_per_prompt < 2:
            raise ValueError(f"samples_per_prompt={self.samples_per_prompt}: a pair needs 2")
        if not 1 <= self.pairs_per_prompt <= self.samples_per_prompt // 2:
            raise ValueError(
                f"pairs_per_prompt={self.pairs_per_prompt} must be in 1.."
                f"{self.samples_per_prompt // 2} (samples_per_prompt // 2)"
            )
        if self.batch_size < 2 or self.batch_size % 2:
            raise ValueError(f"batch_size={self.batch_size} must be even (winner + loser)")
        for name in ("max_train_prompts", "steps", "sample_steps", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not self.eval_seeds:
            raise ValueError("eval_seeds must name at least one seed")
        if not 0.0 <= self.caption_dropout < 1.0:
            raise ValueError(f"caption_dropout={self.caption_dropout} must be in [0, 1)")

    def objective(self, kind: str) -> PreferenceConfig:
        return PreferenceConfig(
            kind=kind,
            beta=self.beta,
            winner_hinge=self.winner_hinge,
            loser_cap=self.loser_cap,
            loser_margin=self.loser_margin,
        )


def preference_stage(
    pretrain_job: JobConfig,
    stage_index: int,
    work: Path,
    train_prompts: Sequence[str],
    eval_prompts: Sequence[str],
    reward: Reward,
    objective: str = "stpo",
    settings: PreferenceStageSettings | None = None,
    eval_targets: Sequence | None = None,
) -> dict:
    """Preference-tune ``pretrain_job.stages[stage_index]`` (finished) with ``objective``
    (``stpo`` or ``dpo``) on on-policy pairs of ``train_prompts`` ranked by ``reward``, and
    measure it on ``eval_prompts``; resumable under ``work`` (module docstring).

    ShapesEval scores each eval prompt's images against ``eval_targets`` (scenes or
    prompts; default the prompts themselves). Returns JSON-able results: ``curves`` (per
    logged step: ``step``, ``loss``, ``winner_gap``, ``loser_gap`` (e − e_ref, per-pixel
    velocity MSE; > 0: that image's likelihood fell), ``margin``, ``accuracy``);
    ``pretrained`` and ``tuned`` measures (``shapes_eval``, ``by_kind``, ``reward``,
    ``artifact`` (mean of the reward's ``artifact`` part, 1 − P(defect), when it has one),
    ``hf_energy``); ``hf_energy_ratio`` (tuned / pretrained); ``samples`` and
    ``pretrained_samples``: ``.npy`` files of uint8 [P, S, H, W, 3] eval images; ``pairs``;
    ``seconds`` spent in this call per part. When the reward ties every prompt's samples
    (a model too weak to rank, e.g. a smoke run) there is no pair: nothing is trained, the
    curves are empty, ``tuned`` is ``pretrained`` and ``note`` says why."""
    settings = settings or PreferenceStageSettings()
    try:
        kind = PreferenceKind(objective)
    except ValueError:
        raise UserError(f"objective {objective!r} is not one of stpo, dpo") from None
    if not train_prompts or not eval_prompts:
        raise UserError("the preference stage needs training prompts and eval prompts")
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    result_path = work / f"{kind.value}.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    targets = list(eval_targets) if eval_targets is not None else list(eval_prompts)
    seconds: dict[str, float] = {}

    t = time.perf_counter()
    pairs = stage_pairs(pretrain_job, stage_index, work, train_prompts, reward, settings)
    side = pretrain_job.stages[stage_index].resolution
    shards = _pair_shards(work, pairs, side, settings) if pairs else None
    seconds["pairs"] = time.perf_counter() - t

    t = time.perf_counter()
    before = _eval(work / "eval-pretrained.npy", pretrain_job, stage_index, eval_prompts, settings)
    seconds["eval_pretrained"] = time.perf_counter() - t

    if not pairs:  # a model too weak to be ranked (a smoke run): nothing to train on
        result = {
            "objective": kind.value, "pairs": 0, "batch_size": 0,
            "note": f"no preference pair: the reward scored all samples of each of the "
            f"{min(len(train_prompts), settings.max_train_prompts)} prompts alike, so "
            "nothing was trained (the model is too weak to rank its samples)",
            "curves": {k: [] for k in CURVE_KEYS},
            "pretrained": (m := measure(before, eval_prompts, targets, reward)), "tuned": m,
            "hf_energy_ratio": 1.0, "samples": str(work / "eval-pretrained.npy"),
            "pretrained_samples": str(work / "eval-pretrained.npy"), "seconds": seconds,
            "settings": asdict(settings),
            "model": {"run": str(pretrain_job.run_dir),
                      "stage": pretrain_job.stages[stage_index].name},
        }  # fmt: skip
        write_json(result_path, result)
        return result

    t = time.perf_counter()
    from krea2.rl.preference.train import train_preference

    assert shards is not None
    run_dir = work / kind.value
    batch = min(settings.batch_size, 2 * len(pairs))
    job = preference_job(
        pretrain_job, stage_index, run_dir, shards, settings.steps, batch, settings.lr,
        settings.warmup_steps, settings.log_every, settings.checkpoint_every,
        settings.caption_dropout,
    )  # fmt: skip
    if not (run_dir / "checkpoints" / f"{PREFERENCE_STAGE}.done").exists():
        link_finished(pretrain_job, stage_index, run_dir)
        train_preference(job, settings.objective(kind.value), resume=True)
    seconds["train"] = time.perf_counter() - t

    t = time.perf_counter()
    after_path = work / f"eval-{kind.value}.npy"
    after = _eval(after_path, job, len(job.stages) - 1, eval_prompts, settings)
    seconds["eval_tuned"] = time.perf_counter() - t

    pre = measure(before, eval_prompts, targets, reward)
    post = measure(after, eval_prompts, targets, reward)
    result = {
        "objective": kind.value,
        "pairs": len(pairs),
        "batch_size": batch,
        "curves": curves(run_dir),
        "pretrained": pre,
        "tuned": post,
        "hf_energy_ratio": post["hf_energy"] / max(pre["hf_energy"], 1e-12),
        "samples": str(after_path),
        "pretrained_samples": str(work / "eval-pretrained.npy"),
        "seconds": seconds,
        "settings": asdict(settings),
        # the tuned model: a finished stage of this run (its config.toml says how)
        "model": {"run": str(run_dir), "stage": PREFERENCE_STAGE},
    }
    write_json(result_path, result)
    return result


def stage_pairs(
    pretrain_job: JobConfig,
    stage_index: int,
    work: Path,
    train_prompts: Sequence[str],
    reward: Reward,
    settings: PreferenceStageSettings,
) -> list[Pair]:
    """The stage's on-policy pairs, generated once into ``work/pairs.json`` (PNGs under
    ``work/pair-images``) and read back on a rerun; a rerun with other pair settings is a
    UserError (the pairs would not be the ones asked for)."""
    from krea2.rl.preference.onpolicy import generate_pairs

    path = work / "pairs.json"
    wanted = {
        k: getattr(settings, k)
        for k in ("max_train_prompts", "samples_per_prompt", "pairs_per_prompt", "pair_seed",
                  "sample_steps", "sample_cfg")
    }  # fmt: skip
    prompts = spread(train_prompts, settings.max_train_prompts)
    wanted["prompts"] = len(prompts)
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["settings"] != wanted:
            raise UserError(
                f"{path} holds pairs made with {saved['settings']}, not {wanted}; "
                "use another work directory (or delete it) to make new pairs"
            )
        return [Pair(**row) for row in saved["pairs"]]
    pairs = generate_pairs(
        pretrain_job, stage_index, prompts, reward, work / "pair-images",
        samples_per_prompt=settings.samples_per_prompt, seed=settings.pair_seed,
        steps=settings.sample_steps, cfg_scale=settings.sample_cfg,
        pairs_per_prompt=settings.pairs_per_prompt,
    )  # fmt: skip
    write_json(path, {"settings": wanted, "pairs": [p.to_row() for p in pairs]})
    return pairs


def spread(items: Sequence[str], most: int) -> list[str]:
    """At most ``most`` of ``items``, evenly spread over them, in order."""
    if len(items) <= most:
        return list(items)
    index = np.unique(np.linspace(0, len(items) - 1, most).round().astype(int))
    return [items[i] for i in index]


def _pair_shards(
    work: Path, pairs: list[Pair], side: int, settings: PreferenceStageSettings
) -> Path:
    """The pairs' training shards under ``work/pair-shards``, written once (atomically)."""
    from krea2.rl.preference.shards import export_pair_shards

    return publish_dir(
        work / "pair-shards",
        lambda tmp: export_pair_shards(pairs, tmp, side, pairs_per_batch=settings.batch_size // 2),
    )


def _eval(
    path: Path, job: JobConfig, index: int, prompts: Sequence[str], s: PreferenceStageSettings
) -> np.ndarray:
    """Eval images uint8 [P, S, H, W, 3] of ``job.stages[index]``'s newest checkpoint, made
    once into ``path``."""
    from krea2.trainer import sample_stage

    return cached_array(path, lambda: sample_stage(
        job, index, list(prompts), list(s.eval_seeds), s.sample_steps, s.sample_cfg
    ))  # fmt: skip


def measure(images: np.ndarray, prompts: Sequence[str], targets: Sequence, reward: Reward) -> dict:
    """ShapesEval against ``targets``, the reward's mean score and its ``artifact`` part's
    mean (None without one), and the high-frequency energy of images uint8 [P, S, H, W, 3]."""
    from krea2.curate.shapes import shapes_eval

    score = shapes_eval(images, list(targets))
    flat = images.reshape(-1, *images.shape[2:])
    scored = reward(flat, [p for p in prompts for _ in range(images.shape[1])])
    artifact = scored.sub_scores.get("artifact")
    return {
        "shapes_eval": score.score,
        "by_kind": score.by_kind,
        "all_correct": score.all_correct,
        "reward": float(np.mean(scored.scores)),
        "artifact": None if artifact is None else float(np.nanmean(artifact)),
        "hf_energy": high_frequency_energy(flat),
    }


def curves(run_dir: Path) -> dict[str, list[float]]:
    """The preference stage's logged training rows as lists per key (:data:`CURVE_KEYS`),
    one value per logged step (a resumed run's repeated steps counted once, the last)."""
    from krea2.trainer import read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    rows = {}
    for row in read_metrics(path) if path.exists() else []:
        if row.get("kind") == "train" and row.get("stage") == PREFERENCE_STAGE:
            rows[row["step"]] = row
    ordered = [rows[s] for s in sorted(rows)]
    return {k: [float(r[k]) for r in ordered] for k in CURVE_KEYS}


def shapes_preference_reward(artifact_head: Path, artifact_weight: float = 0.5) -> Reward:
    """The ShapesWorld ranking reward: the rubric verifier + ``artifact_weight`` x the
    artifact reward (1 − P(defect)), as a ``WeightedSum`` with parts ``rubric`` and
    ``artifact``. The artifact head is trained once (400 renders, ~10 s) and saved to
    ``artifact_head``; later calls load it."""
    from krea2.rl.rewards import (
        ArtifactReward,
        ShapesRubricReward,
        WeightedSum,
        train_artifact_reward,
    )

    path = Path(artifact_head)
    if path.exists():
        artifact = ArtifactReward.load(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        artifact = train_artifact_reward(n=400, seed=0, path=path, epochs=200)
    rubric = ShapesRubricReward(ocr=False)
    return WeightedSum({"rubric": (rubric, 1.0), "artifact": (artifact, artifact_weight)})
