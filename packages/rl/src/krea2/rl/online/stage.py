"""The RL stage of the demo and its proof: GRPO or DiffusionNFT from a pretrained stage on
ShapesWorld-style prompts, measured with and without CFG on held-out prompts.

Everything is left under ``work`` and reused by a rerun: the artifact reward's head, the
curated prompt pool (``pool.json``, with why each prompt was dropped), the pretrained
model's evaluation, the run (resumed from its newest checkpoint) and the result
(``<name>.json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from krea2.infra.atomic import cached_array, publish_dir, write_json
from krea2.rl.online.config import GrpoConfig, RlObjective
from krea2.trainer import JobConfig

# The stage's rewards by name (shapes_rewards) -> their kind (krea2.rl.rewards.load_reward).
REWARD_KINDS = {"rubric": "rubric", "artifact": "artifact", "shape": "shape-fidelity"}
CURVE_KEYS = ("step", "rollout_images", "seconds", "loss", "reward_rubric", "reward_artifact",
              "reward_shape", "eval_shapes", "eval_all_correct", "eval_artifact", "eval_bg_noise",
              "first_ratio_max_dev", "clip_fraction", "flat_groups", "kl")  # fmt: skip


def demo_objective() -> GrpoConfig:
    """The RL stage's default objective: DiffusionNFT (no SDE window) with the rubric and
    the artifact reward (weight 0.5) aggregated by GDPO, the artifact and noise guards on."""
    return GrpoConfig(
        objective=RlObjective.NFT, window_size=0, window_start_max=0,
        rewards={k: REWARD_KINDS[k] for k in ("rubric", "artifact")},
        weights={"rubric": 1.0, "artifact": 0.5}, artifact_bound=0.5, noise_bound=2.0,
    )  # fmt: skip


@dataclass
class RlStageSettings:
    """How big the RL stage is (a demo recipe's ``[rl]`` table; docs/rl.md); the objective
    itself is ``grpo``, the library's :class:`GrpoConfig` (``[rl.grpo]``), not a copy.

    Pool: up to ``max_train_prompts`` training prompts, curated from ``pool_samples``
    no-CFG samples each (dropped: always solved unless ``keep_solved``, never solved unless
    ``keep_unsolved``, no variance; the harder a kept prompt, the more often it is drawn,
    up to ``hard_repeats`` times: :func:`krea2.rl.online.pool.training_pool`). Training:
    ``steps`` iterations of ``prompts_per_step`` prompts x ``grpo.group_size`` images at
    ``lr`` (decaying linearly to 0 over the last ``lr_decay_ratio`` of the steps; with
    ``ema_decay`` > 0 the tuned model is the EMA of the weights, per iteration), full
    fine-tuning or LoRA of ``lora_rank``. Rewards: ``grpo.weights`` names some of
    ``rubric``, ``artifact`` and ``shape`` (:func:`shapes_rewards`; ``shape_whole``: the
    shape-fidelity reward also asks for each object in one piece), ``grpo.rewards`` their
    kinds (:data:`REWARD_KINDS`); the artifact head is calibrated on ``calibration_seeds``
    no-CFG samples per training prompt of the starting model (0: trained on renders alone).
    Evaluation: the held-out prompts x ``eval_seeds`` in ``eval_steps`` Euler steps,
    without CFG every ``eval_every`` steps (the curves) and at the start and end also with
    CFG ``eval_cfg``. ``seed``: the run's rollout noise, prompt order and adapter init
    (None: the starting job's seed), to repeat a run and see its spread."""

    steps: int = 60
    prompts_per_step: int = 8
    lr: float = 3e-4
    lr_decay_ratio: float = 0.0
    ema_decay: float = 0.0
    max_train_prompts: int = 64
    pool_samples: int = 4
    keep_unsolved: bool = False
    keep_solved: bool = False
    hard_repeats: int = 1
    shape_whole: bool = False
    calibration_seeds: int = 2
    lora_rank: int = 0
    eval_every: int = 10
    eval_steps: int = 20
    eval_cfg: float = 3.0
    eval_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    curve_seeds: list[int] = field(default_factory=lambda: [0])
    eval_tuned_cfg: bool = True
    checkpoint_every: int = 20
    seed: int | None = None
    grpo: GrpoConfig = field(default_factory=demo_objective)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "max_train_prompts", "pool_samples",
                     "hard_repeats"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not 0 <= self.lr_decay_ratio <= 1:
            raise ValueError(f"lr_decay_ratio={self.lr_decay_ratio} must be in [0, 1]")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay={self.ema_decay} must be in [0, 1)")
        if self.calibration_seeds < 0:
            raise ValueError(f"calibration_seeds={self.calibration_seeds} must be >= 0")
        unknown = sorted(set(self.grpo.weights) - set(REWARD_KINDS))
        if unknown:
            raise ValueError(
                f"grpo.weights names {unknown}; the stage's rewards are {sorted(REWARD_KINDS)}"
            )

    @property
    def objective(self) -> str:
        """``grpo`` or ``nft``."""
        return self.grpo.objective.value


def settings_with(base: dict, changes: dict) -> RlStageSettings:
    """:class:`RlStageSettings` from plain data (e.g. a result's ``settings``) with
    ``changes``: a key of :class:`GrpoConfig` changes the objective (``objective=grpo``,
    ``aggregation=sum_then_normalize``), any other the stage."""
    from dataclasses import fields

    from krea2.infra.config import build_config

    objective_keys = {f.name for f in fields(GrpoConfig)}
    data = {k: v for k, v in base.items() if k != "grpo"}
    grpo = dict(base.get("grpo", {}))
    for key, value in changes.items():
        (grpo if key in objective_keys else data)[key] = value
    return build_config(RlStageSettings, {**data, "grpo": grpo}, "rl")


def stage_job(
    pretrain_job: JobConfig, stage_index: int, run_dir: Path, shards: Path, s: RlStageSettings
) -> JobConfig:
    """The RL stage's trainer job (:func:`krea2.rl.online.train.rl_job`) sized by ``s``, on
    ``s.seed`` where set (rollout noise, prompt order and adapter init of a repeat run)."""
    from krea2.rl.online.train import rl_job

    job = rl_job(pretrain_job, stage_index, run_dir, shards, s.steps, s.prompts_per_step, s.lr,
                 0, s.lora_rank, s.checkpoint_every, 1, s.lr_decay_ratio,
                 s.ema_decay)  # fmt: skip
    return job if s.seed is None else replace(job, seed=s.seed)


def measure(images: np.ndarray, prompts: Sequence[str], targets: Sequence, rewards) -> dict:
    """ShapesEval (score, all-requirements-correct rate, by kind) against ``targets``, the
    mean artifact reward and the mean background noise
    (:func:`~krea2.rl.online.guards.background_noise`) of images uint8 [P, S, H, W, 3]."""
    from krea2.curate.shapes import shapes_eval
    from krea2.rl.online.guards import background_noise

    score = shapes_eval(images, list(targets))
    flat = images.reshape(-1, *images.shape[2:])
    art = rewards["artifact"](flat, [p for p in prompts for _ in range(images.shape[1])])
    return {"shapes_eval": score.score, "all_correct": score.all_correct,
            "by_kind": score.by_kind, "artifact": float(np.mean(art.scores)),
            "bg_noise": float(background_noise(flat).mean())}  # fmt: skip


def make_eval_hook(job: JobConfig, stage_index: int, prompts, targets, rewards, s: RlStageSettings):
    """The objective's held-out measure: no-CFG samples of ``prompts`` x ``s.curve_seeds``
    (the noise of ``krea2.trainer.sample_stage``, so step 0 equals the pretrained eval)."""
    from krea2.trainer import sample_module

    def evaluate(module, step: int) -> dict:
        images = sample_module(job, stage_index, module, list(prompts), list(s.curve_seeds),
                               s.eval_steps, 0.0)  # fmt: skip
        m = measure(images, prompts, targets, rewards)
        return {"shapes": m["shapes_eval"], "all_correct": m["all_correct"],
                "artifact": m["artifact"], "bg_noise": m["bg_noise"]}  # fmt: skip

    return evaluate


def rl_stage(
    pretrain_job: JobConfig,
    stage_index: int,
    work: Path,
    train_prompts: Sequence[str],
    eval_prompts: Sequence[str],
    eval_targets: Sequence,
    settings: RlStageSettings | None = None,
    name: str | None = None,
    start_samples: Mapping[str, Path] | None = None,
) -> dict:
    """RL-tune ``pretrain_job.stages[stage_index]`` (finished) on the curated
    ``train_prompts`` and measure it on ``eval_prompts`` (ShapesEval against
    ``eval_targets``, with and without CFG); resumable under ``work`` (module docstring).
    ``name`` (default the objective) names the run directory and result file, so several
    variants can share one ``work``. ``start_samples`` (``"cfg"``/``"no_cfg"`` -> ``.npy``):
    the start model's samples another stage drew on ``eval_prompts`` with the settings'
    eval seeds, steps and CFG, measured instead of sampled again. Returns JSON-able
    results: ``pool`` (verdict counts),
    ``pretrained``/``tuned`` measures ``{"no_cfg": ..., "cfg": ...}`` (``shapes_eval``,
    ``all_correct``, ``by_kind``, ``artifact``), ``curves`` (per logged step:
    :data:`CURVE_KEYS`), ``samples`` (``.npy`` uint8 [P, S, H, W, 3], no CFG, tuned and
    pretrained), ``stopped`` (the guard's reason, if it stopped the run: then ``tuned`` is
    the pretrained model, which is what the stage keeps) and ``seconds``."""
    from krea2.infra.errors import UserError
    from krea2.rl.online.pool import (
        curate_pool,
        pool_statistics,
        read_records,
        reason_counts,
        training_pool,
        write_records,
    )
    from krea2.rl.online.prompts import export_prompt_shards
    from krea2.rl.online.train import train_rl
    from krea2.rl.online.world_rewards import shapes_rewards
    from krea2.trainer import TrainingStopped, link_finished, sample_stage

    s = settings or RlStageSettings()
    name = name or s.objective
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    result_path = work / f"{name}.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    if not train_prompts or not eval_prompts:
        raise UserError("the RL stage needs training prompts and eval prompts")
    gc = s.grpo
    seconds: dict[str, float] = {}
    t = time.perf_counter()

    def calibration_samples() -> np.ndarray:  # the pretrained model's, training prompts
        seeds = [7000 + i for i in range(s.calibration_seeds)]
        prompts = _spread(train_prompts, s.max_train_prompts)
        images = sample_stage(pretrain_job, stage_index, prompts, seeds, gc.sample_steps, 0.0)
        return images.reshape(-1, *images.shape[2:])

    rewards = shapes_rewards(
        work, calibration_samples if s.calibration_seeds else None, s.shape_whole
    )
    seconds["artifact_head"] = time.perf_counter() - t

    t = time.perf_counter()
    pool_path = work / "pool.json"
    prompts = _spread(train_prompts, s.max_train_prompts)
    if not pool_path.exists():
        scores = pool_statistics(pretrain_job, stage_index, prompts, rewards["rubric"],
                                 s.pool_samples, gc.sample_steps)  # fmt: skip
        meta = {"samples": s.pool_samples, "steps": gc.sample_steps, "cfg": 0.0}
        write_records(pool_path, curate_pool(prompts, scores), meta)
    records = read_records(pool_path)
    pool = training_pool(records, s.hard_repeats, s.keep_unsolved, s.keep_solved) or prompts
    seconds["pool"] = time.perf_counter() - t

    def evaluate(job: JobConfig, index: int, tag: str, with_cfg: bool = True,
                 drawn: Mapping[str, Path] | None = None) -> dict:  # fmt: skip
        out = {}
        for key, scale in (("no_cfg", 0.0), ("cfg", s.eval_cfg))[: 2 if with_cfg else 1]:
            path = Path((drawn or {}).get(key) or work / f"eval-{tag}-{key}.npy")
            images = cached_array(path, lambda job=job, index=index, scale=scale: sample_stage(
                job, index, list(eval_prompts), list(s.eval_seeds), s.eval_steps, scale
            ))  # fmt: skip
            out[key] = measure(images, eval_prompts, eval_targets, rewards)
            out[key]["samples"] = str(path)
        return out

    t = time.perf_counter()
    before = evaluate(pretrain_job, stage_index, "pretrained", drawn=start_samples)
    write_json(work / "eval-pretrained.json", before)
    seconds["eval_pretrained"] = time.perf_counter() - t

    t = time.perf_counter()
    run_dir = work / name
    shards = work / "prompt-shards"
    side = pretrain_job.stages[stage_index].resolution
    publish_dir(shards, lambda tmp: export_prompt_shards(pool, tmp, side, s.prompts_per_step))
    job = stage_job(pretrain_job, stage_index, run_dir, shards, s)
    hook = make_eval_hook(job, len(job.stages) - 1, list(eval_prompts), list(eval_targets),
                          rewards, s)  # fmt: skip
    stopped = None
    done = run_dir / "checkpoints" / "rl.done"
    if not done.exists():
        link_finished(pretrain_job, stage_index, run_dir)
        try:
            trained = {k: rewards[k] for k in gc.weights}  # the rewards the run weighs
            train_rl(job, gc, trained, resume=True, evaluate=hook, eval_every=s.eval_every)
        except TrainingStopped as exc:
            stopped = str(exc)
            write_json(run_dir / "stopped.json", {"reason": stopped})
    elif (run_dir / "stopped.json").exists():
        stopped = json.loads((run_dir / "stopped.json").read_text())["reason"]
    seconds["train"] = time.perf_counter() - t

    t = time.perf_counter()
    if stopped is None:
        after = evaluate(job, len(job.stages) - 1, name, s.eval_tuned_cfg)
    else:  # the guard fired: a checkpoint holds the weights it rejected, keep the start
        after = before
    seconds["eval_tuned"] = time.perf_counter() - t
    result = {
        "name": name,
        "objective": s.objective,
        "pool": reason_counts(records),
        "pool_prompts": len(pool),
        "pretrained": before,
        "tuned": after,
        "curves": curves(run_dir),
        "stopped": stopped,
        "seconds": seconds,
        "settings": asdict(s),
        # the model the stage keeps: the tuned stage, or its start when the guard fired
        "model": {"run": str(run_dir), "stage": job.stages[-1].name}
        if stopped is None
        else {"run": str(pretrain_job.run_dir), "stage": pretrain_job.stages[stage_index].name},
    }
    write_json(result_path, result)
    return result


def curves(run_dir: Path) -> dict[str, list]:
    """The RL stage's logged rows per key of :data:`CURVE_KEYS` (None where a row lacks
    it: eval numbers exist only on eval steps); ``rollout_images`` and ``seconds`` are
    cumulative (a resumed run's repeated steps counted once, the last)."""
    from krea2.trainer import read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    rows: dict[int, dict] = {}
    for row in read_metrics(path) if path.exists() else []:
        if row.get("kind") == "train" and row.get("stage") == "rl":
            rows[row["step"]] = row
    ordered = [rows[k] for k in sorted(rows)]
    out: dict[str, list] = {k: [] for k in CURVE_KEYS}
    images = seconds = 0.0
    for r in ordered:
        images += r.get("rollout_images", 0)
        seconds += r.get("step_time", 0.0)
        for k in CURVE_KEYS:
            value = {"rollout_images": images, "seconds": seconds}.get(k, r.get(k))
            out[k].append(value)
    return out


def _spread(items: Sequence[str], most: int) -> list[str]:
    if len(items) <= most:
        return list(items)
    index = np.unique(np.linspace(0, len(items) - 1, most).round().astype(int))
    return [items[i] for i in index]
