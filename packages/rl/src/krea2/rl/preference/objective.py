"""The preference objective on the trainer's loop: one step of Diffusion-DPO or STPO over a
batch of (winner, loser) pairs, plugged in as ``Trainer(cfg, objective=...)``.

A batch holds pairs as consecutive rows (winner, then loser, written so by
:func:`krea2.rl.preference.pairs.export_pair_shards`). Both images of a pair share one
flow time t and one noise draw, seeded by (job seed, step, pair index) so any split over
ranks sees the same numbers. The policy runs one forward and backward on all 2P images;
the frozen reference (the stage's starting weights) one forward without grad. With the
stage's ``caption_dropout`` > 0 a pair's prompt is dropped (the empty caption, CFG's
negative) with that probability, as pretraining drops captions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from krea2.dit import flow
from krea2.infra.errors import UserError
from krea2.rl.preference.loss import PreferenceConfig, pair_terms
from krea2.trainer import (
    DistEnv,
    JobConfig,
    StageRun,
    all_reduce_sum,
    draw_time_and_noise,
    finish_grads,
    sample_generator,
    stage_mu,
    update_lr,
)

# metric name -> index in the all-reduced per-pair sums
_SUMS = ("loss", "winner_gap", "loser_gap", "margin", "accuracy", "winner_error", "loser_error")


def pair_prompts(batch: dict, step: int) -> list[str]:
    """One prompt per pair of ``batch``; UserError when rows are not (winner, loser) pairs
    of one prompt (a shard not written by ``export_pair_shards``)."""
    metas, captions = batch["meta"], batch["captions"]
    if len(metas) % 2:
        raise UserError(f"step {step}: a rank's batch of {len(metas)} rows splits a pair")
    prompts = []
    for i in range(0, len(metas), 2):
        roles = (metas[i].get("role"), metas[i + 1].get("role"))
        same = metas[i].get("pair") == metas[i + 1].get("pair")
        if roles != ("winner", "loser") or not same:
            raise UserError(
                f"step {step}: rows {batch['keys'][i]!r}, {batch['keys'][i + 1]!r} are not a "
                "(winner, loser) pair; train on shards from krea2 rl export-pairs"
            )
        prompts.append(captions[i][0]["text"] if captions[i] else "")
    return prompts


def style_conditioning(
    module: torch.nn.Module,
    batch: dict,
    encode: Callable[[list[str], torch.Tensor], torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """The style module's inputs for a batch of pairs with a ``reference`` column (shards
    of style-conditioned pairs): each row's reference latents [B, 1, C, h, w] at strength
    1, as the pair was sampled; {} for pairs without references. UserError when the
    references and the stage's module do not go together (a stage that fine-tunes a style
    module trains on such pairs only, via ``style_from``)."""
    refs = batch.get("reference_pixels")
    has_module = getattr(module, "style", None) is not None
    if refs is None and not has_module:
        return {}
    if refs is None or not has_module:
        raise UserError(
            "pairs with a reference column train a style module (a stage with style_from)"
            if refs is not None
            else "a stage that fine-tunes a style module needs pairs with a reference column"
        )
    with torch.no_grad():
        keys = [f"{k}#reference" for k in batch["keys"]]
        latents = encode(keys, refs.to(device).float() / 127.5 - 1.0)
    ones = torch.ones(latents.shape[0], 1, device=device)
    return {"style_refs": latents.to(dtype)[:, None], "style_strengths": ones}


class PreferenceObjective:
    """Diffusion-DPO or STPO (``cfg.kind``) as a :class:`krea2.trainer.Objective`."""

    needs_reference = True

    def __init__(self, cfg: PreferenceConfig) -> None:
        self.cfg = cfg

    def __call__(
        self,
        run: StageRun,
        batch: dict,
        step: int,
        cfg: JobConfig,
        env: DistEnv,
        encode: Callable[[list[str], torch.Tensor], torch.Tensor],
        bad_samples_counter: Any,
    ) -> dict[str, Any]:
        """The batch's preference loss, backpropagated; metrics all-reduced over dp:
        ``loss``, ``winner_gap``/``loser_gap`` (mean e - e_ref of each branch),
        ``margin`` (β·w(t)·(loser gap - winner gap)), ``accuracy`` (share of pairs whose
        winner gained on the loser against the reference), ``winner_error``/``loser_error``."""
        stage, module, ref = run.stage, run.module, run.reference
        if ref is None:
            raise RuntimeError("the trainer built no reference; needs_reference is ignored")
        prompts = pair_prompts(batch, step)
        pairs = len(prompts)
        weight = batch["weight"].to(env.device)
        bad = float((weight == 0).sum())
        if bad:
            bad_samples_counter.labels(stage=stage.name).inc(bad)
        pair_w = torch.minimum(weight[0::2], weight[1::2])  # a pair counts only whole
        lr = update_lr(run, step)
        first = env.dp_rank * pairs
        gens = [sample_generator(cfg.seed, step, first + j) for j in range(pairs)]
        pixels = batch["pixels"].to(env.device).float() / 127.5 - 1.0
        with torch.no_grad():
            latents = encode(batch["keys"], pixels)
        latents = latents.to(next(module.dit.parameters()).dtype)
        patch = module.dit.cfg.patch
        tokens = (latents.shape[2] // patch) * (latents.shape[3] // patch)
        mu = stage_mu(stage.time_shift, tokens)
        t, noise = draw_time_and_noise(
            gens, tuple(latents.shape[1:]), mu, stage.time_loc, stage.time_scale
        )
        if stage.caption_dropout > 0:  # drawn after t and noise: their stream is unchanged
            # A pair whose caption is dropped trains the unconditional branch toward the same
            # winner, so CFG's direction (cond - uncond) keeps its size (docs/rl.md).
            prompts = [
                "" if float(torch.rand((), generator=g)) < stage.caption_dropout else p
                for p, g in zip(prompts, gens, strict=True)
            ]
        t2 = t.repeat_interleave(2).to(env.device)
        noise2 = noise.repeat_interleave(2, 0).to(env.device, latents.dtype)
        x_t = flow.interpolate(latents, noise2, t2)
        target = flow.velocity_target(latents, noise2).float()
        captions = [p for p in prompts for _ in range(2)]
        tt = t2.to(latents.dtype)
        style = style_conditioning(module, batch, encode, env.device, latents.dtype)
        v, _ = module(x_t, tt, captions, **style)
        err = (v.float() - target).square().flatten(1).mean(1)
        with torch.no_grad():
            v_ref, _ = ref(x_t, tt, captions, **style)
            err_ref = (v_ref.float() - target).square().flatten(1).mean(1)
        terms = pair_terms(self.cfg, err[0::2], err[1::2], err_ref[0::2], err_ref[1::2], t)
        total_w = all_reduce_sum(pair_w.sum().detach().double().clone(), env)
        loss = (terms.loss * pair_w).sum() * env.dp / total_w.to(pair_w.dtype).clamp_min(1e-12)
        loss.backward()
        grad_norm = finish_grads(run, cfg, env)
        per_pair = torch.stack(
            [
                terms.loss.detach(),
                terms.winner_gap,
                terms.loser_gap,
                terms.margin,
                (terms.margin > 0).float(),
                terms.winner_error,
                err[1::2].detach(),
            ]
        )
        sums = all_reduce_sum((per_pair.double() * pair_w.double()).sum(1), env)
        denom = float(total_w.clamp_min(1e-12))
        out: dict[str, Any] = {name: float(sums[i]) / denom for i, name in enumerate(_SUMS)}
        out.update(grad_norm=grad_norm, lr=lr, mu=mu, image_tokens=tokens, bad_samples=bad)
        return out
