"""DiffusionNFT's update on a batch of rollouts (:class:`~krea2.rl.online.objective.GrpoObjective`
with ``objective = "nft"``; the loss is :func:`~krea2.rl.online.loss.nft_terms`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from krea2.dit import flow
from krea2.rl.online.config import GrpoConfig
from krea2.rl.online.loss import nft_terms, nft_terms_adaptive, optimality
from krea2.rl.online.old_policy import OldPolicy
from krea2.rl.online.sde import Rollout
from krea2.trainer import (
    DistEnv,
    JobConfig,
    StageRun,
    all_reduce_sum,
    draw_time_and_noise,
    finish_grads,
    sample_generator,
)

# sample_generator(seed, step, index) index space of the forward-process draws, far from
# the objective's (rollout noise from 0, window 2**40, shared noise 2**41).
NFT_INDEX = 2**42


def nft_update(
    gc: GrpoConfig,
    run: StageRun,
    cfg: JobConfig,
    env: DistEnv,
    rollouts: list[Rollout],
    caps: list[list[str]],
    adv: np.ndarray,
    n_global: int,
    step: int,
    mu: float,
    old: OldPolicy | None,
) -> dict[str, Any]:
    """Backpropagate the NFT loss of this rank's rollouts (micro-batches ``rollouts`` with
    captions ``caps``, advantages ``adv`` [P, G] in their row order; ``n_global`` images
    over all ranks) at ``nft_times`` forward-process points per image, drawn from the
    stage's time distribution (shift ``mu``) and seeded by (job seed, ``step``, global
    image index); ``v_old`` from ``old`` (None: the current weights, detached); plus
    ``kl_beta`` x ‖v_θ − v_ref‖². Finishes the gradients (the trainer steps) and returns
    the step's metrics, all-reduced: loss, optimality_mean, kl, grad_norm."""
    module, ref, stage = run.module, run.reference, run.stage
    dtype = next(module.dit.parameters()).dtype
    r_all = torch.tensor(optimality(adv.reshape(-1)), dtype=torch.float32)
    first = env.dp_rank * (n_global // env.dp)
    acc = torch.zeros(4, dtype=torch.float64)  # loss, optimality, kl, n
    for c, (ro, chunk_caps) in enumerate(zip(rollouts, caps, strict=True)):
        lo = c * gc.micro_batch
        x0 = ro.x0.to(dtype)
        r = r_all[lo : lo + x0.shape[0]].to(env.device)
        for j in range(gc.nft_times):
            gens = [
                sample_generator(cfg.seed, step, NFT_INDEX + (first + lo + i) * gc.nft_times + j)
                for i in range(x0.shape[0])
            ]
            t, eps = draw_time_and_noise(gens, tuple(x0.shape[1:]), mu, stage.time_loc,
                                         stage.time_scale)  # fmt: skip
            t = t.to(env.device)
            eps = eps.to(env.device, dtype)
            x_t = flow.interpolate(x0, eps, t)
            target = flow.velocity_target(x0, eps)
            v_old = None
            if old is not None:
                with old.swapped_in(), torch.no_grad():
                    v_old = module(x_t, t.to(dtype), chunk_caps)[0]
            v = module(x_t, t.to(dtype), chunk_caps)[0]
            v_old = v.detach() if v_old is None else v_old
            if gc.nft_weighting == "adaptive":
                rows = nft_terms_adaptive(v, v_old, x_t, t, x0, r, gc.nft_beta)
            else:
                rows = nft_terms(v, v_old, target, r, gc.nft_beta)
            kl = torch.zeros_like(rows)
            if gc.kl_beta > 0:
                assert ref is not None
                with torch.no_grad():
                    v_ref = ref(x_t, t.to(dtype), chunk_caps)[0]
                kl = (v.float() - v_ref.float()).square().flatten(1).mean(1)
            loss = (rows + gc.kl_beta * kl).sum()
            (loss * env.dp / (n_global * gc.nft_times)).backward()
            acc += torch.tensor([float(rows.detach().sum()), float(r.sum()),
                                 float(kl.detach().sum()), float(r.numel())],
                                dtype=torch.float64)  # fmt: skip
    grad_norm = finish_grads(run, cfg, env)
    acc = all_reduce_sum(acc, env)
    return {
        "loss": float(acc[0] / acc[3]),
        "optimality_mean": float(acc[1] / acc[3]),
        "kl": float(acc[2] / acc[3]),
        "grad_norm": grad_norm,
    }
