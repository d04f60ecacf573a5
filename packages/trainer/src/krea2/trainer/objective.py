"""The rectified-flow objective: what the DiT predicts (v, x0 or split), per-sample weights,
time-bucket stats."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from krea2.dit import flow
from krea2.infra.errors import UserError
from krea2.trainer.config import Prediction

TIME_BUCKETS = 4  # loss is also reported per quarter of t in [0, 1]


def _block_mean(x: Tensor, k: int) -> Tensor:
    """Each k x k block of x [B, C, H, W] replaced by its mean."""
    return torch.nn.functional.avg_pool2d(x, k).repeat_interleave(k, -2).repeat_interleave(k, -1)


@dataclass(frozen=True)
class Parameterization:
    """What the DiT's output stands for (``ModelConfig.prediction``) and how it becomes the
    velocity v = noise - x0 that the loss and the sampler work in (contract 5).

    ``min_t``: floor of t where x0 is turned into v = (x_t - x0) / t. ``detail``: for
    ``split``, the side of the blocks whose mean is v and whose detail is x0 (1: plain v).
    """

    prediction: Prediction = Prediction.VELOCITY
    min_t: float = 0.05
    detail: int = 1

    @classmethod
    def for_patches(
        cls, prediction: Prediction, min_t: float, model_patch: int, stage_patch: int, where: str
    ) -> Parameterization:
        """``split`` in a stage whose patch is k times the model's has detail k (1 when
        equal); UserError (naming ``where``) when the stage's patch is not a multiple."""
        detail = 1
        if prediction is Prediction.SPLIT and stage_patch > model_patch:
            if stage_patch % model_patch:
                raise UserError(
                    f"{where}: prediction 'split' needs patch {stage_patch} to be a multiple "
                    f"of the model's patch {model_patch}"
                )
            detail = stage_patch // model_patch
        return cls(prediction, min_t, detail)

    def velocity(self, out: Tensor, x_t: Tensor, t: Tensor) -> Tensor:
        """The velocity [B, C, H, W] that the DiT output ``out`` [B, C, H, W] stands for, at
        noised latents ``x_t`` [B, C, H, W] and flow time ``t`` [B]."""
        plain_split = self.prediction is Prediction.SPLIT and self.detail == 1
        if self.prediction is Prediction.VELOCITY or plain_split:
            return out
        tt = t.to(x_t.dtype).clamp_min(self.min_t).view(-1, *[1] * (x_t.dim() - 1))
        if self.prediction is Prediction.X0:  # v = eps - x0 with eps = (x_t - (1 - t) x0) / t
            return (x_t - out) / tt
        # split: v for the mean of each detail x detail block, x0 for what is left inside
        # it; the detail of v is then (detail(x_t) - detail(x0)) / t, noise passed through.
        coarse = _block_mean(out, self.detail)
        return coarse + ((x_t - _block_mean(x_t, self.detail)) - (out - coarse)) / tt


@dataclass
class FlowTerms:
    """Per-sample pieces of one flow step (all [B] except where noted)."""

    per_sample: Tensor  # mean squared velocity error of each sample
    t: Tensor  # flow time, 1 = noise
    x_t: Tensor  # [B, C, H, W] noised latents


def stage_mu(time_shift: float | None, image_tokens: int) -> float:
    """The time shift mu of a stage, for training and for sampling alike: the stage's fixed
    ``time_shift`` if it has one, else the resolution rule of ``krea2.dit.flow``."""
    return time_shift if time_shift is not None else flow.resolution_mu(image_tokens)


def sample_seed(seed: int, step: int, index: int) -> int:
    """Seed of global sample ``index`` at ``step``: its noise, time and caption draws do not
    depend on how the batch is split over ranks, so any layout sees the same numbers."""
    return int(np.random.SeedSequence([seed, step, index]).generate_state(1, np.uint64)[0] >> 1)


def sample_generator(seed: int, step: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(sample_seed(seed, step, index))


def draw_time_and_noise(
    generators: list[torch.Generator],
    shape: tuple[int, ...],
    mu: float,
    loc: float = 0.0,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Per sample: t from the shifted logit-normal (mu = the stage's shift), then noise of
    ``shape``. Returns (t [B] fp32, noise [B, *shape] fp32), on CPU."""
    ts, noises = [], []
    for g in generators:
        ts.append(flow.sample_training_times(1, mu=mu, loc=loc, scale=scale, generator=g))
        noises.append(torch.randn(shape, generator=g, dtype=torch.float32))
    return torch.cat(ts), torch.stack(noises)


def flow_terms(
    velocity,
    latents: Tensor,
    txt: Tensor,
    txt_mask: Tensor,
    t: Tensor,
    noise: Tensor,
) -> FlowTerms:
    """Score ``velocity(x_t, txt, t, mask)`` against v = noise - latents (contract 5).

    latents and noise [B, C, H, W]; t [B] flow time (1 = noise).
    """
    noise = noise.to(latents.device, latents.dtype)
    t = t.to(latents.device)
    x_t = flow.interpolate(latents, noise, t)
    v = velocity(x_t, txt, t.to(latents.dtype), txt_mask)
    err = (v.float() - flow.velocity_target(latents, noise).float()).square()
    return FlowTerms(err.flatten(1).mean(1), t, x_t)


def weighted_loss(per_sample: Tensor, weight: Tensor, global_weight: Tensor, dp: int) -> Tensor:
    """This rank's share of the global mean: sum(w * l) * dp / sum over all ranks of w.

    FSDP averages gradients over the ``dp`` ranks, so the dp factor makes the update that
    of the global weighted mean; padded (weight 0) samples contribute nothing.
    """
    return (per_sample * weight).sum() * dp / global_weight.clamp_min(1e-12)


def time_bucket_sums(per_sample: Tensor, t: Tensor, weight: Tensor) -> Tensor:
    """[2, TIME_BUCKETS]: weighted loss sums and weights per t quarter (for all-reduce)."""
    idx = (t.float() * TIME_BUCKETS).long().clamp(0, TIME_BUCKETS - 1).to(per_sample.device)
    out = torch.zeros(2, TIME_BUCKETS, dtype=torch.float64, device=per_sample.device)
    out[0].index_add_(0, idx, (per_sample.detach() * weight).double())
    out[1].index_add_(0, idx, weight.double())
    return out
