"""GRPO and DiffusionNFT on the trainer's loop: one trainer step is one RL iteration.

A step's batch rows are prompts (prompt shards, :mod:`krea2.rl.online.prompts`). The
objective rolls out ``group_size`` images per prompt without CFG on the training module
itself (FSDP: every rank rolls out its own prompts; all ranks run the same number of
forwards), scores them in-process, turns the rewards into advantages and trains:
``inner_steps`` optimizer updates for GRPO (all but the last taken here, the last by the
trainer), one for DiffusionNFT. With ``nft_old_decay`` > 0, DiffusionNFT rolls out with
its old policy (:class:`~krea2.rl.online.old_policy.OldPolicy`, soft-updated at the start of
every iteration and checkpointed with the run).

Every random draw (initial noise, SDE noise, window, NFT times) is seeded by (job seed,
step, global index), so a resumed run redraws exactly the same rollouts and any split of
the batch over ranks sees the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from krea2.dit import flow
from krea2.rl.online.advantage import Aggregation, advantages, batch_moments, gdpo_sum
from krea2.rl.online.config import GrpoConfig, RlObjective
from krea2.rl.online.guards import artifact_alarm, gate_rewards, noise_alarm
from krea2.rl.online.loss import gaussian_kl, grpo_terms
from krea2.rl.online.nft_update import nft_update
from krea2.rl.online.old_policy import OldPolicy
from krea2.rl.online.sde import Rollout, sde_rollout, step_log_prob
from krea2.rl.rewards import Reward
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
_WINDOW, _SHARED = 2**40, 2**41  # (the NFT update's: nft_update.NFT_INDEX = 2**42)

EvalHook = Callable[[Any, int], dict[str, Any]]


def autoencoder_of(cfg: JobConfig, device: torch.device):
    """The job's autoencoder (``model.autoencoder``, with the older ``ae_factor`` folded
    into a pixel spec as the trainer does)."""
    from krea2.dit import load_autoencoder

    spec = cfg.model.autoencoder
    factor = getattr(cfg.model, "ae_factor", None)
    if spec == "pixel" and factor not in (None, 1):
        spec = f"pixel:{factor}"
    return load_autoencoder(spec, device=device)


def window_start(seed: int, step: int, most: int) -> int:
    """The first SDE step of ``step``'s window, uniform in 0..``most``."""
    g = sample_generator(seed, step, _WINDOW)
    return int(torch.randint(0, most + 1, (1,), generator=g))


class GrpoObjective:
    """GRPO or DiffusionNFT (``gc.objective``) as a :class:`krea2.trainer.Objective`.

    ``rewards``: name → in-process :class:`Reward` (the names of ``gc.weights``).
    ``evaluate(module, step)``: optional held-out measure run on every rank every
    ``eval_every`` steps and at the last; its numbers join the step's metrics (e.g.
    ``eval_shapes``, ``eval_artifact``). With ``gc.artifact_bound`` the run stops
    (:class:`krea2.trainer.TrainingStopped`) when ``eval_artifact`` falls below
    (1 - bound) x its first value (:func:`~krea2.rl.online.guards.artifact_alarm`); with
    ``gc.noise_bound`` when ``eval_bg_noise`` rises above bound x its first value
    (:func:`~krea2.rl.online.guards.noise_alarm`)."""

    def __init__(
        self,
        gc: GrpoConfig,
        rewards: Mapping[str, Reward],
        evaluate: EvalHook | None = None,
        eval_every: int = 0,
    ) -> None:
        missing = sorted(set(gc.weights) - set(rewards))
        if missing:
            raise ValueError(f"no reward given for {missing}")
        self.gc = gc
        self.rewards = dict(rewards)
        self.evaluate = evaluate
        self.eval_every = eval_every
        self.needs_reference = gc.kl_beta > 0
        self._ae = None
        self.first_artifact: float | None = None
        self.first_noise: float | None = None
        self._old: OldPolicy | None = None

    # ------------------------------------------------------------------ old policy
    def _keeps_old_policy(self) -> bool:
        return self.gc.objective is RlObjective.NFT and self.gc.nft_old_decay > 0

    def state(self, run: StageRun) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint keeps for this objective: the old policy's, if any
        (created here at the current weights when a resume asks for the template)."""
        return self._old_of(run).state_dict() if self._keeps_old_policy() else {}

    def old_policy(self, run: StageRun, step: int) -> OldPolicy | None:
        """The old policy for ``step``: the current weights at the stage's first step (also
        when a template was made before the warm start), else one soft update of the
        previous iteration's (loaded from the checkpoint after a resume)."""
        if not self._keeps_old_policy():
            return None
        old = self._old_of(run)
        old.update(0.0 if step == 0 else self.gc.nft_old_decay)
        return old

    def _old_of(self, run: StageRun) -> OldPolicy:
        if self._old is None:  # at the current weights; a resume then loads it in place
            self._old = OldPolicy(run.params)
        return self._old

    # ------------------------------------------------------------------ rollouts
    def rollout(
        self,
        module: Any,
        prompts: list[str],
        step: int,
        cfg: JobConfig,
        env: DistEnv,
        side: int,
    ) -> tuple[list[Rollout], list[list[str]], np.ndarray, float]:
        """Roll out ``group_size`` images per prompt (rows prompt-major: prompt p's images
        are rows p·G .. p·G + G - 1) in micro-batches; returns the micro-batches'
        rollouts, their captions, the decoded images uint8 [P·G, H, W, 3] and mu."""
        from krea2.dit import to_uint8

        gc = self.gc
        if self._ae is None:
            self._ae = autoencoder_of(cfg, env.device)
        ae = self._ae
        dtype = next(module.dit.parameters()).dtype
        f = ae.spatial_factor
        shape = (ae.latent_channels, side // f, side // f)
        tokens = (shape[1] // module.dit.cfg.patch) * (shape[2] // module.dit.cfg.patch)
        mu = stage_mu(self._stage_shift, tokens)
        times = flow.sampling_times(gc.sample_steps, mu)
        start = window_start(cfg.seed, step, gc.window_start_max)
        window = list(range(start, start + gc.window_size)) if gc.window_size else []
        first = env.dp_rank * len(prompts)
        g_size = gc.group_size
        index = [(first + p) * g_size + j for p in range(len(prompts)) for j in range(g_size)]
        gens = [sample_generator(cfg.seed, step, i) for i in index]
        if gc.shared_noise:
            per_prompt = [
                torch.randn(shape, generator=sample_generator(cfg.seed, step, _SHARED + first + p))
                for p in range(len(prompts))
            ]
            noise = torch.stack([n for n in per_prompt for _ in range(g_size)])
        else:
            noise = torch.stack([torch.randn(shape, generator=g) for g in gens])
        captions = [p for p in prompts for _ in range(g_size)]
        noise_level = gc.noise_level if window else 0.0
        outs, caps, images = [], [], []
        for lo in range(0, len(captions), gc.micro_batch):
            rows = slice(lo, lo + gc.micro_batch)
            chunk_caps = captions[rows]

            def velocity(x, t, c=chunk_caps):
                return module(x, t.to(x.dtype), c)[0]

            ro = sde_rollout(
                velocity, noise[rows].to(env.device), times, window, noise_level, gens[rows], dtype
            )
            outs.append(ro)
            caps.append(chunk_caps)
            with torch.no_grad():
                images.append(to_uint8(ae.decode(ro.x0.float())).cpu().numpy())
        return outs, caps, np.concatenate(images), mu

    # ------------------------------------------------------------------ rewards
    def score(
        self, images: np.ndarray, prompts: list[str], env: DistEnv
    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, float]]:
        """Advantages [P, G], the (gated) rewards name → [P, G] and reward metrics
        (batch means over all ranks, the share of groups without spread)."""
        gc = self.gc
        g_size = gc.group_size
        captions = [p for p in prompts for _ in range(g_size)]
        raw = {
            name: np.asarray(reward(images, captions).scores, np.float64).reshape(-1, g_size)
            for name, reward in self.rewards.items()
        }
        rewards = gate_rewards(raw, gc.artifact_gate) if gc.artifact_gate is not None else raw
        moments = None
        if gc.aggregation is Aggregation.NORMALIZE_THEN_SUM:
            local = torch.tensor(batch_moments(gdpo_sum(rewards, gc.weights)), dtype=torch.float64)
            moments = tuple(float(v) for v in all_reduce_sum(local, env))
        adv = np.clip(advantages(rewards, gc.weights, gc.aggregation, moments), -gc.adv_clip,
                      gc.adv_clip)  # fmt: skip
        stats = []
        for name in self.rewards:
            stats += [raw[name].sum(), (raw[name] ** 2).sum()]
        flat = sum(float(gc.weights[k]) * rewards[k] for k in rewards)
        stats += [float((flat.std(1) < 1e-6).sum()), float(flat.size), float(flat.shape[0])]
        sums = all_reduce_sum(torch.tensor(stats, dtype=torch.float64), env).tolist()
        n = sums[-2]
        metrics = {}
        for i, name in enumerate(self.rewards):
            mean = sums[2 * i] / n
            metrics[f"reward_{name}"] = mean
            metrics[f"reward_{name}_std"] = float(np.sqrt(max(sums[2 * i + 1] / n - mean**2, 0)))
        metrics["flat_groups"] = sums[-3] / sums[-1]
        return adv, rewards, metrics

    # ------------------------------------------------------------------ the step
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
        """One RL iteration (module docstring); metrics all-reduced over the dp ranks."""
        from krea2.rl.online.prompts import batch_prompts
        from krea2.trainer import TrainingStopped

        module = run.module
        self._stage_shift = run.stage.time_shift
        prompts = batch_prompts(batch, step)
        side = int(batch["pixels"].shape[-1])
        lr = update_lr(run, step)
        out: dict[str, Any] = {}
        if self.evaluate is not None and self.eval_every and step % self.eval_every == 0:
            out.update(self._eval(module, step))
        t0 = time.perf_counter()
        old = self.old_policy(run, step)
        with old.swapped_in() if old is not None else nullcontext():
            rollouts, caps, images, mu = self.rollout(module, prompts, step, cfg, env, side)
        t1 = time.perf_counter()
        adv, _, reward_metrics = self.score(images, prompts, env)
        t2 = time.perf_counter()
        adv_t = torch.tensor(adv.reshape(-1), dtype=torch.float32, device=env.device)
        n_global = len(prompts) * self.gc.group_size * env.dp
        if self.gc.objective is RlObjective.GRPO:
            train = self._grpo(run, cfg, env, rollouts, caps, adv_t, n_global, step)
        else:
            train = nft_update(self.gc, run, cfg, env, rollouts, caps, adv, n_global, step, mu,
                               old)  # fmt: skip
        t3 = time.perf_counter()
        out.update(reward_metrics)
        out.update(train)
        out.update(
            lr=lr, mu=mu, image_tokens=self._tokens(module, side), bad_samples=0.0,
            rollout_images=n_global, time_rollout=t1 - t0, time_reward=t2 - t1,
            time_train=t3 - t2,
        )  # fmt: skip
        why = None
        bound = self.gc.artifact_bound
        art = out.get("eval_artifact")
        if bound is not None and art is not None:
            if self.first_artifact is None:
                self.first_artifact = art
            else:
                why = artifact_alarm(self.first_artifact, art, bound)
        noise = out.get("eval_bg_noise")
        if why is None and self.gc.noise_bound is not None and noise is not None:
            if self.first_noise is None:
                self.first_noise = noise
            else:
                why = noise_alarm(self.first_noise, noise, self.gc.noise_bound)
        if why is not None:
            stands = "the newest checkpoint before it stands"
            raise TrainingStopped(f"step {step}: {why} (reward hacking guard); {stands}")
        return out

    def _tokens(self, module, side: int) -> int:
        f = self._ae.spatial_factor * module.dit.cfg.patch
        return (side // f) ** 2

    def _eval(self, module, step: int) -> dict[str, Any]:
        assert self.evaluate is not None
        was = module.training
        result = self.evaluate(module, step)
        module.train(was)
        return {f"eval_{k}": v for k, v in result.items()}

    def _grpo(self, run, cfg, env, rollouts, caps, adv, n_global, step) -> dict[str, Any]:
        gc, module, ref = self.gc, run.module, run.reference
        dtype = next(module.dit.parameters()).dtype
        n_chunks = len(rollouts)
        if n_chunks % gc.inner_steps:
            from krea2.infra.errors import UserError

            raise UserError(
                f"{n_chunks} micro-batches per rank do not split into inner_steps="
                f"{gc.inner_steps} minibatches; change micro_batch or inner_steps"
            )
        per = n_chunks // gc.inner_steps
        width = len(rollouts[0].window)
        denom = n_global / gc.inner_steps * width / env.dp
        acc = torch.zeros(6, dtype=torch.float64)  # loss, ratio, clipped, kl, first-ratio dev, n
        first_dev = torch.zeros(1, dtype=torch.float64)
        grad_norm = 0.0
        for inner in range(gc.inner_steps):
            for c in range(inner * per, (inner + 1) * per):
                ro, chunk_caps = rollouts[c], caps[c]
                lo = c * gc.micro_batch
                rows = slice(0, ro.x0.shape[0])
                a = adv[lo : lo + ro.x0.shape[0]]

                def velocity(x, t, m=module, cc=chunk_caps):
                    return m(x, t.to(x.dtype), cc)[0]

                for k in range(width):
                    logp, mean = step_log_prob(velocity, ro, k, rows, dtype)
                    loss_rows, ratio, clipped = grpo_terms(logp, ro.log_probs[k], a, gc.clip)
                    kl = torch.zeros_like(loss_rows)
                    if gc.kl_beta > 0:
                        assert ref is not None

                        def ref_velocity(x, t, cc=chunk_caps):
                            return ref(x, t.to(x.dtype), cc)[0]

                        with torch.no_grad():
                            _, mean_ref = step_log_prob(ref_velocity, ro, k, rows, dtype)
                        kl = gaussian_kl(mean, mean_ref, ro.stds[k])
                    loss = (loss_rows + gc.kl_beta * kl).sum() / denom
                    loss.backward()
                    acc += torch.tensor([float(loss_rows.detach().sum()), float(ratio.sum()),
                                         float(clipped.sum()), float(kl.detach().sum()), 0.0,
                                         float(ratio.numel())], dtype=torch.float64)  # fmt: skip
                    if inner == 0:
                        dev = float((ratio.double() - 1).abs().max())
                        first_dev[0] = max(float(first_dev[0]), dev)
            grad_norm = finish_grads(run, cfg, env)
            if inner < gc.inner_steps - 1:  # the trainer takes the last minibatch's step
                for opt in run.optimizers:
                    opt.step()
                for opt in run.optimizers:
                    opt.zero_grad(set_to_none=True)
        acc = all_reduce_sum(acc, env)
        if env.distributed:
            import torch.distributed as dist

            dist.all_reduce(first_dev, op=dist.ReduceOp.MAX)
        n = float(acc[5])
        return {
            "loss": float(acc[0]) / n,
            "ratio_mean": float(acc[1]) / n,
            "clip_fraction": float(acc[2]) / n,
            "kl": float(acc[3]) / n,
            "first_ratio_max_dev": float(first_dev[0]),
            "grad_norm": grad_norm,
            "window_start": rollouts[0].window[0] if rollouts[0].window else -1,
        }
