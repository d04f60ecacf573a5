"""One training step's loss: the state a stage's loop works on, and the forward and
backward pass of one batch (objective, iREPA, weighted all-rank mean, clipping)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from krea2.infra.checkpoint import CheckpointManager
from krea2.infra.errors import UserError
from krea2.trainer.build import TrainModule
from krea2.trainer.captions import choose_captions
from krea2.trainer.config import JobConfig, StageConfig
from krea2.trainer.data import ShardIndex
from krea2.trainer.distributed import DistEnv, all_reduce_sum
from krea2.trainer.ema import WeightEma
from krea2.trainer.evaluate import to_unit
from krea2.trainer.objective import (
    TIME_BUCKETS,
    draw_time_and_noise,
    flow_terms,
    sample_generator,
    stage_mu,
    time_bucket_sums,
    weighted_loss,
)
from krea2.trainer.optim import clip_grad_norm, set_lr
from krea2.trainer.parallelize import sum_tp_partial_grads
from krea2.trainer.schedule import wsd_factor
from krea2.trainer.stability import SpikeDetector


class TrainingStopped(UserError):
    """The run stopped on purpose (too many bad steps or samples); the message says why."""


@dataclass
class StageState:
    """Per-stage loop state that is saved with every checkpoint (as JSON ``extra``)."""

    step: int = 0  # next step to run
    skip: list[int] = field(default_factory=list)  # batches never to train on (rollbacks)
    stability: dict[str, Any] | None = None


@dataclass
class StageRun:
    """What one stage's loop works on: its data, module, optimizers, checkpoints and guard."""

    stage: StageConfig
    data: ShardIndex
    module: TrainModule
    optimizers: list[torch.optim.Optimizer]
    params: list[nn.Parameter]  # the trainable ones, for clipping
    tp_partial: list[nn.Parameter]  # QK-norm scales whose grads are summed over the tp ranks
    checkpoints: CheckpointManager
    detector: SpikeDetector
    state: StageState = field(default_factory=StageState)
    encoder: nn.Module | None = None  # iREPA's frozen encoder, while iREPA is on
    # a frozen copy of the weights the stage started from, when its objective asks for one
    reference: TrainModule | None = None
    ema: WeightEma | None = None  # the stage's weight average, with stage.ema_decay > 0
    # the stage's loss in place of flow matching (stage.objective; None: forward_backward)
    objective: Objective | None = None


class Objective(Protocol):
    """A stage's loss in place of flow matching (e.g. preference optimization in
    ``krea2.rl``), passed as ``Trainer(cfg, objective=...)``.

    Called like :func:`forward_backward` (same arguments, same contract): it computes the
    batch's loss, backpropagates it, calls :func:`finish_grads` and returns the step's
    metrics (a ``"loss"`` and ``"grad_norm"`` at least, all-reduced over the dp ranks).
    With ``needs_reference`` the trainer also builds ``run.reference``: the stage's module
    at its starting weights (its warm start), frozen, parallelized like the policy.
    An objective that keeps tensors of its own across steps (e.g. an RL old policy) may
    define ``state(run) -> dict[str, Tensor]``: checkpoints hold them and a resume loads
    them in place, so the run continues exactly.
    """

    needs_reference: bool

    def __call__(
        self,
        run: StageRun,
        batch: dict,
        step: int,
        cfg: JobConfig,
        env: DistEnv,
        encode: Callable[[list[str], torch.Tensor], torch.Tensor],
        bad_samples_counter: Any,
    ) -> dict[str, Any]: ...


def update_lr(run: StageRun, step: int) -> float:
    """Set the optimizers' learning rate for ``step`` of the stage's schedule; returns it."""
    return set_lr(run.optimizers, wsd_factor(step, run.stage.steps, run.stage.schedule))


def finish_grads(run: StageRun, cfg: JobConfig, env: DistEnv) -> float:
    """After backward: sum the tensor-parallel partial grads and clip all grads to
    ``optimizer.grad_clip``; returns the global grad norm before clipping."""
    if env.tp > 1:
        sum_tp_partial_grads(run.tp_partial, env.mesh["tp"])
    return clip_grad_norm(run.params, cfg.optimizer.grad_clip)


def forward_backward(
    run: StageRun,
    batch: dict,
    step: int,
    cfg: JobConfig,
    env: DistEnv,
    encode: Callable[[list[str], torch.Tensor], torch.Tensor],
    bad_samples_counter: Any,
    conditioning: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The loss of ``batch`` (pixels uint8 [B, 3, H, W], captions, weights [B]),
    backpropagated, its grads summed and clipped; returns the step's metrics, all-reduced
    over the dp ranks. ``encode(keys, pixels)`` gives latents [B, C, h, w]; undecodable
    samples (weight 0) count on ``bad_samples_counter`` (a labelled Prometheus counter).
    ``conditioning``: more keyword arguments of the module's forward (an objective's
    extra inputs, e.g. the style objective's reference latents)."""
    stage, module = run.stage, run.module
    local = batch["pixels"].shape[0]
    weight = batch["weight"].to(env.device)
    bad = float((weight == 0).sum())
    if bad:
        bad_samples_counter.labels(stage=stage.name).inc(bad)
    if bad / max(local, 1) > cfg.stability.max_bad_samples:
        raise TrainingStopped(
            f"step {step}: {int(bad)} of {local} samples could not be decoded "
            f"(over stability.max_bad_samples={cfg.stability.max_bad_samples}); "
            "check the shards named in the log"
        )
    lr = update_lr(run, step)
    first = env.dp_rank * local
    gens = [sample_generator(cfg.seed, step, first + j) for j in range(local)]
    captions = choose_captions(
        batch["captions"], stage.caption_weights, stage.caption_dropout, gens
    )
    pixels = to_unit(batch["pixels"]).to(env.device)
    with torch.no_grad():
        latents = encode(batch["keys"], pixels)
    latents = latents.to(next(module.dit.parameters()).dtype)
    patch = module.dit.cfg.patch
    tokens = (latents.shape[2] // patch) * (latents.shape[3] // patch)
    mu = stage_mu(stage.time_shift, tokens)
    t, noise = draw_time_and_noise(
        gens, tuple(latents.shape[1:]), mu, stage.time_loc, stage.time_scale
    )
    target = None
    if run.encoder is not None:
        grid = (latents.shape[2] // patch, latents.shape[3] // patch)
        target = run.encoder(pixels, grid)
    aux_box: list = []

    def velocity(x, _txt, tt, _mask):
        v, aux = module(x, tt, captions, target, **(conditioning or {}))
        aux_box.append(aux)
        return v

    terms = flow_terms(velocity, latents, None, None, t, noise)
    total_w = all_reduce_sum(weight.sum().detach().double().clone(), env)
    loss = weighted_loss(terms.per_sample, weight, total_w.to(weight.dtype), env.dp)
    irepa_loss = aux_box[0] if aux_box and aux_box[0] is not None else None
    if irepa_loss is not None:
        loss = loss + stage.irepa.weight * irepa_loss
    loss.backward()
    grad_norm = finish_grads(run, cfg, env)
    stats = time_bucket_sums(terms.per_sample, terms.t, weight)
    flow_sum = torch.stack([(terms.per_sample.detach() * weight).sum().double()])
    packed = torch.cat([flow_sum, stats.flatten()])
    if irepa_loss is not None:
        packed = torch.cat([packed, irepa_loss.detach().double().view(1) / env.dp])
    all_reduce_sum(packed, env)
    flow_loss = float(packed[0] / total_w.clamp_min(1e-12))
    stats = packed[1 : 1 + 2 * TIME_BUCKETS].view(2, TIME_BUCKETS)
    out: dict[str, Any] = {
        "loss": flow_loss,
        "grad_norm": grad_norm,
        "lr": lr,
        "mu": mu,
        "image_tokens": tokens,
        "bad_samples": bad,
    }
    for b in range(TIME_BUCKETS):
        n = float(stats[1, b])
        out[f"loss_t{b}"] = float(stats[0, b]) / n if n else None
    if irepa_loss is not None:
        out["irepa_loss"] = float(packed[-1])
    return out
