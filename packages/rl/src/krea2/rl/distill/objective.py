"""TDM and DMD2 on the trainer's loop: one trainer step is one distillation iteration.

Data-free: a step's batch rows are prompts (prompt shards,
:func:`krea2.rl.online.export_prompt_shards`); only their captions and side are used. The
student is the stage's module; the teacher is ``run.reference`` (the stage's frozen start,
CFG in krea2's convention at w = g − 1); the fake score is :class:`FakeScore`. Per step:

1. roll the student out from seeded noise on its K-step grid (no gradient, no CFG);
2. ``fake_updates`` times: draw a step k, s, τ and noise per sample, take the student's
   x̂0 and ε̂ at step k's input (no gradient), re-noise to x_τ and take one AdamW step of
   the fake score on min(SNR, cap)·weight·‖x0_fake(x_τ) − x̂0‖²;
3. draw again, predict x̂0 from step k's input with gradient, re-noise (detached), query
   the teacher (cond and uncond in one doubled forward) and the fake score, and
   backpropagate the normalised Pseudo-Huber loss to x̂0 + Δ; the trainer takes the
   student's optimizer step.

Every draw comes from ``sample_generator(seed, step, index)`` of the sample's global index
(offset per use), so 2 ranks draw what 1 rank draws and a resume redraws the same numbers.
All metrics are sums all-reduced over the dp ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from krea2.dit import flow
from krea2.rl.distill.config import FakeScoreKind, TdmConfig
from krea2.rl.distill.fake_score import FakeScore
from krea2.rl.distill.loss import (
    dmd_normaliser,
    fake_score_loss,
    importance_weight,
    noise_from_velocity,
    normalised_dmd_gradient,
    student_loss,
    teacher_terms,
    x0_from_velocity,
)
from krea2.rl.distill.trajectory import (
    StagePoints,
    draw_points,
    pick_inputs,
    renoise,
    rollout_inputs,
)
from krea2.trainer import (
    DistEnv,
    JobConfig,
    StageRun,
    all_reduce_sum,
    finish_grads,
    sample_generator,
    stage_mu,
    update_lr,
)

# Index spaces of sample_generator(seed, step, index), far apart so they never collide.
_STUDENT, _FAKE, _FAKE_STRIDE = 2**40, 2**41, 2**32

# Named slots of the step's all-reduced sums (metrics travel by name, not by position).
_SUMS = ("n", "loss", "dm_grad_sq", "gap", "cfg_term", "normaliser", "x0_sq", "fake_n",
         "fake_loss", "is_weight", "is_clipped")  # fmt: skip


class TdmObjective:
    """TDM or DMD2 (``settings.mode``) as a :class:`krea2.trainer.Objective` for ``job``.

    The fake score is built on first use: in the first step, or when a resume asks for
    :meth:`state` (the template a checkpoint loads in place). With an ``adapter`` fake score
    (a LoRA student) the teacher is the student's module with its adapters off, so the
    trainer builds no reference copy."""

    def __init__(self, settings: TdmConfig, job: JobConfig) -> None:
        self.settings = settings
        self.job = job
        self.needs_reference = settings.fake is not FakeScoreKind.ADAPTER
        self._fake: FakeScore | None = None
        self._frozen_loaded = False  # the fake's frozen part copied from the teacher
        self._ae = None

    # ------------------------------------------------------------------ the fake score
    def state(self, run: StageRun) -> dict[str, Tensor]:
        """The fake score's trained weights and AdamW moments (objective checkpoint state)."""
        return self._fake_of(run, None).state_dict()

    def _fake_of(self, run: StageRun, env: DistEnv | None) -> FakeScore:
        if self._fake is None:
            if env is None:  # a resume: the trainer asks for the state before any step
                from krea2.trainer.distributed import init_distributed

                env = init_distributed(self.job)
            lr = self.settings.fake_lr
            if lr is None:
                lr = run.stage.lr if run.stage.lr is not None else self.job.optimizer.lr
            # build_module reseeds the global RNG (a seeded build); keep the run's stream as
            # it was, so building here or at a resume changes no later draw
            devices = [env.device] if env.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                self._fake = FakeScore.build(self.job, run.stage, env, self.settings, lr,
                                             student=run.module)  # fmt: skip
        return self._fake

    def _teacher(self, run: StageRun):
        """The frozen teacher: the trainer's reference copy, or the student's own module
        with its adapters off (an ``adapter`` fake score)."""
        if run.reference is not None:
            return run.reference
        return _AdaptersOff(run.module)

    def _ready_fake(self, run: StageRun, env: DistEnv, step: int) -> FakeScore:
        """The fake score for ``step``: the teacher's weights at the stage's first step;
        after a resume the checkpoint's trained part and the teacher's frozen part."""
        fake = self._fake_of(run, env)
        if step == 0 or not self._frozen_loaded:
            fake.load_teacher(self._teacher(run), trained_too=step == 0)
            self._frozen_loaded = True
        return fake

    # ------------------------------------------------------------------ the step
    def __call__(
        self,
        run: StageRun,
        batch: dict,
        step: int,
        cfg: JobConfig,
        env: DistEnv,
        encode: Callable[[list[str], Tensor], Tensor],
        bad_samples_counter: Any,
    ) -> dict[str, Any]:
        """One distillation iteration (module docstring); metrics all-reduced over dp."""
        from krea2.rl.online.prompts import batch_prompts

        s = self.settings
        prompts = batch_prompts(batch, step)
        lr = update_lr(run, step)
        fake = self._ready_fake(run, env, step)
        shape, tokens = self._latent_shape(run, cfg, env, int(batch["pixels"].shape[-1]))
        mu = stage_mu(run.stage.time_shift, tokens)
        times = flow.sampling_times(s.student_steps, mu)
        first = env.dp_rank * len(prompts)
        index = [first + j for j in range(len(prompts))]
        n_global = float(all_reduce_sum(torch.tensor([float(len(prompts))]), env)[0])
        sums = dict.fromkeys(_SUMS, 0.0)
        sums["stage_loss"] = [0.0] * s.student_steps
        sums["stage_n"] = [0.0] * s.student_steps

        t0 = time.perf_counter()
        noise = torch.stack([torch.randn(shape, generator=sample_generator(cfg.seed, step, i))
                             for i in index]).to(env.device)  # fmt: skip
        dtype = next(run.module.dit.parameters()).dtype
        student = _velocity_of(run.module, prompts)
        states = rollout_inputs(student, noise.to(dtype), times)
        t1 = time.perf_counter()
        fake_norms = []
        for u in range(s.fake_updates):
            points = self._draw(cfg.seed, step, index, _FAKE + u * _FAKE_STRIDE, times, shape)
            fake_norms.append(self._fake_update(fake, student, states, points, prompts, env,
                                                n_global, sums))  # fmt: skip
        t2 = time.perf_counter()
        points = self._draw(cfg.seed, step, index, _STUDENT, times, shape)
        self._student_update(run, fake, states, points, prompts, env, n_global, sums)
        grad_norm = finish_grads(run, cfg, env)
        t3 = time.perf_counter()

        k_steps = s.student_steps
        flat = [sums[k] for k in _SUMS] + sums["stage_loss"] + sums["stage_n"]
        red = all_reduce_sum(torch.tensor(flat, dtype=torch.float64), env).tolist()
        got = dict(zip(_SUMS, red[: len(_SUMS)], strict=True))
        stage_loss = red[len(_SUMS) : len(_SUMS) + k_steps]
        stage_n = red[len(_SUMS) + k_steps :]
        n, fake_n = max(got["n"], 1.0), max(got["fake_n"], 1.0)
        out: dict[str, Any] = {
            "loss": got["loss"] / n,
            "grad_norm": grad_norm,
            "fake_loss": got["fake_loss"] / fake_n,
            "fake_grad_norm": sum(fake_norms) / len(fake_norms),
            # RMS of −Δ / normaliser: the size of the normalised DMD step per element
            "dm_grad_norm": (got["dm_grad_sq"] / n) ** 0.5,
            "teacher_fake_gap": got["gap"] / n,  # mean |x0_cond − x0_fake|, latent units
            "cfg_term": got["cfg_term"] / n,  # mean |w·(x0_cond − x0_uncond)|
            "dmd_normaliser": got["normaliser"] / n,  # mean |x̂0 − x0_teacher_cfg|
            "x0_rms": (got["x0_sq"] / n) ** 0.5,  # the student's x̂0 scale: blow-up/collapse
            "is_weight": got["is_weight"] / fake_n,
            "is_weight_clipped": got["is_clipped"] / fake_n,
            "lr": lr,
            "fake_lr": fake.optimizer.param_groups[0]["lr"],
            "mu": mu,
            "image_tokens": tokens,
            "bad_samples": 0.0,
            "time_rollout": t1 - t0,
            "time_fake": t2 - t1,
            "time_student": t3 - t2,
        }
        for k, (total, count) in enumerate(zip(stage_loss, stage_n, strict=True)):
            out[f"loss_step{k}"] = total / count if count else None  # per student step k
        return out

    # ------------------------------------------------------------------ pieces
    def _latent_shape(
        self, run: StageRun, cfg: JobConfig, env: DistEnv, side: int
    ) -> tuple[tuple[int, int, int], int]:
        """The stage's latent shape (C, h, w) for square images of ``side`` px and its
        image-token count."""
        if self._ae is None:
            from krea2.rl.online.objective import autoencoder_of

            self._ae = autoencoder_of(cfg, env.device)
        f = self._ae.spatial_factor
        shape = (self._ae.latent_channels, side // f, side // f)
        patch = run.module.dit.cfg.patch
        return shape, (shape[1] // patch) * (shape[2] // patch)

    def _draw(self, seed, step, index, offset, times, shape) -> StagePoints:
        s = self.settings
        gens = [sample_generator(seed, step, offset + i) for i in index]
        return draw_points(gens, times, shape, s.mode, s.intervals, s.random_mid)

    def _fake_update(self, fake, student, states, points, prompts, env, n_global, sums) -> float:
        """One AdamW step of the fake score on the student's samples; returns its grad
        norm and adds its sums to ``sums``."""
        s = self.settings
        x_in = pick_inputs(states, points.stage)
        t_in = points.t_in.to(x_in.device)
        dtype = next(fake.module.dit.parameters()).dtype
        with torch.no_grad():
            v = student(x_in.to(dtype), t_in).float()
            x0 = x0_from_velocity(x_in, t_in, v)
            eps = noise_from_velocity(x_in, t_in, v)
        noise = points.noise.to(x_in.device)
        x_tau, mixed = renoise(x0, eps, points.t_mid, points.t_query, noise)
        if s.importance_weights:
            weight, clipped = importance_weight(mixed, noise, s.weight_clip)
        else:
            weight, clipped = torch.ones(x0.shape[0]), torch.zeros(x0.shape[0], dtype=torch.bool)
        tau = points.t_query.to(x_in.device)
        with fake.active():  # the backward too: activation checkpointing recomputes in it
            v_fake = fake.velocity(x_tau.to(dtype), tau, prompts).float()
            per = fake_score_loss(x0_from_velocity(x_tau, tau, v_fake), x0, tau, weight,
                                  s.snr_cap)  # fmt: skip
            # this rank's share of the global mean; FSDP averages gradients over the dp ranks
            (per.sum() * env.dp / n_global).backward()
        sums["fake_n"] += per.numel()
        sums["fake_loss"] += float(per.detach().sum())
        sums["is_weight"] += float(weight.sum())
        sums["is_clipped"] += float(clipped.float().sum())
        return fake.step(env)

    def _student_update(self, run, fake, states, points, prompts, env, n_global, sums) -> None:
        """The student's loss at ``points``, backpropagated (the trainer steps)."""
        s = self.settings
        module, teacher = run.module, self._teacher(run)
        x_in = pick_inputs(states, points.stage)
        t_in = points.t_in.to(x_in.device)
        dtype = next(module.dit.parameters()).dtype
        v = module(x_in.to(dtype), t_in.to(dtype), prompts)[0].float()
        x0 = x0_from_velocity(x_in, t_in, v)  # carries the student's gradient
        eps = noise_from_velocity(x_in, t_in, v.detach())
        noise = points.noise.to(x_in.device)
        x_tau, _ = renoise(x0.detach(), eps, points.t_mid, points.t_query, noise)
        tau = points.t_query.to(x_in.device)
        w = s.krea_guidance
        with torch.no_grad():
            x0_cond, x0_uncond = _teacher_x0(teacher, x_tau, tau, prompts, w, dtype)
            x0_fake = x0_from_velocity(
                x_tau, tau, fake.velocity(x_tau.to(dtype), tau, prompts).float()
            )
            terms = teacher_terms(x0_cond, x0_uncond, x0_fake, w, s.split_teacher_term,
                                  s.cfg_weight, s.dm_weight)  # fmt: skip
            norm = dmd_normaliser(x0, terms.x0_teacher_cfg)
        per = student_loss(x0, terms.delta, norm, s.huber)
        (per.sum() * env.dp / n_global).backward()
        with torch.no_grad():
            step_dir = normalised_dmd_gradient(terms.delta, norm)
            sums["n"] += per.numel()
            sums["loss"] += float(per.detach().sum())
            sums["dm_grad_sq"] += float(step_dir.square().flatten(1).mean(1).sum())
            sums["gap"] += float(terms.dm.abs().flatten(1).mean(1).sum())
            sums["cfg_term"] += float(terms.cfg.abs().flatten(1).mean(1).sum())
            sums["normaliser"] += float(norm.sum())
            sums["x0_sq"] += float(x0.detach().square().flatten(1).mean(1).sum())
            for k, value in zip(points.stage.tolist(), per.detach().tolist(), strict=True):
                sums["stage_loss"][k] += value
                sums["stage_n"][k] += 1.0


def _teacher_x0(
    teacher, x: Tensor, t: Tensor, prompts: list[str], w: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor | None]:
    """The teacher's x0 [B, C, H, W] at x [B, C, H, W], t [B], conditioned on ``prompts``
    and (when krea2's scale w ≠ 0) on the empty prompt, both in one doubled forward as
    krea2's sampler runs CFG; (x0_cond, x0_uncond or None)."""
    b = x.shape[0]
    if not w:
        return x0_from_velocity(x, t, teacher(x.to(dtype), t.to(dtype), prompts)[0].float()), None
    xx, tt = torch.cat([x, x]).to(dtype), torch.cat([t, t]).to(dtype)
    v2 = teacher(xx, tt, [*prompts, *[""] * b])[0].float()
    return x0_from_velocity(x, t, v2[:b]), x0_from_velocity(x, t, v2[b:])


class _AdaptersOff:
    """A LoRA student's module called with every adapter off: its frozen base, which is the
    teacher (no gradient is taken through it)."""

    def __init__(self, module) -> None:
        self.module = module

    def __call__(self, x: Tensor, t: Tensor, captions: list[str]):
        from krea2.trainer.lora import adapter_in_use

        with adapter_in_use(self.module.dit, None):
            return self.module(x, t, captions)


def _velocity_of(module, captions: list[str]):
    """``velocity(x, t)`` of a training module conditioned on ``captions``."""

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        return module(x, t.to(x.dtype), captions)[0]

    return velocity
