"""Flow schedules, training-time sampling, and the Euler + CFG sampler."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.krea2.pipeline_krea2 import Krea2Pipeline

from krea2.dit import flow
from krea2.dit.generation import generate
from krea2.dit.model import Krea2DiT
from krea2.dit.patches import image_positions, patchify, unpatchify
from krea2.dit.pixel_ae import PixelAE
from krea2.dit.sampler import (
    dit_velocity,
    euler_sample,
    euler_step,
    seeded_noise,
    with_cfg,
    with_negative,
)
from krea2.dit.testing import randomize
from krea2.infra.errors import UserError


@pytest.mark.parametrize(
    ("px", "mu"), [(256, 0.5), (512, 0.58125), (1024, 0.90625), (1280, 1.15), (2048, 2.20625)]
)
def test_resolution_mu_reference_values(px, mu):
    assert flow.resolution_mu(flow.image_tokens(px, px)) == pytest.approx(mu, abs=1e-12)


def test_turbo_grid_reference_values():
    want = [1.0, 0.9567, 0.9045, 0.8403, 0.7595, 0.6546, 0.5128, 0.3109, 0.0]
    assert flow.turbo_times(8).tolist() == pytest.approx(want, abs=5e-5)


@pytest.mark.parametrize(("steps", "tokens"), [(28, 1024), (8, 4096), (50, 300)])
def test_schedule_equals_diffusers_scheduler(steps, tokens):
    sched = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=6400, time_shift_type="exponential",
    )  # fmt: skip
    mu = flow.resolution_mu(tokens)
    sched.set_timesteps(sigmas=[1 - k / steps for k in range(steps)], mu=mu)  # as the pipeline
    ours = flow.sampling_times(steps, mu)
    assert ours.tolist() == pytest.approx(sched.sigmas.double().tolist(), abs=1e-6)


def test_image_tokens_rejects_indivisible_size():
    with pytest.raises(UserError, match="not divisible by 16"):
        flow.image_tokens(1000, 1024)


def test_training_times_are_shifted_logit_normal():
    g = torch.Generator().manual_seed(0)
    t = flow.sample_training_times(200_000, mu=1.0, loc=0.0, scale=1.0, generator=g)
    assert t.min() > 0 and t.max() < 1
    assert t.median().item() == pytest.approx(math.e / (math.e + 1), abs=5e-3)
    # Unshift analytically and check the logit is N(0, 1).
    u = 1 / (1 + math.e * (1 / t.double() - 1))
    z = torch.logit(u)
    assert z.mean().item() == pytest.approx(0.0, abs=0.01)
    assert z.std().item() == pytest.approx(1.0, abs=0.01)


def test_interpolation_and_target_follow_the_convention():
    data, noise = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    t = torch.tensor([0.0, 0.5, 1.0])
    xt = flow.interpolate(data, noise, t)
    torch.testing.assert_close(xt[0], data[0])
    torch.testing.assert_close(xt[2], noise[2])
    # d x_t / dt = noise - data = the target
    dt = 1e-3
    xt2 = flow.interpolate(data, noise, t + dt)
    torch.testing.assert_close(
        (xt2 - xt) / dt, flow.velocity_target(data, noise), atol=1e-2, rtol=0
    )


def test_euler_recovers_data_with_the_exact_velocity():
    """For a point-mass data distribution v(x, t) = (x - x*) / t, Euler is exact on any grid."""
    target = torch.randn(2, 3, 4, 4)

    def velocity(x, t):
        return (x - target) / t.view(-1, 1, 1, 1)

    noise = seeded_noise([0, 1], (3, 4, 4))
    x0 = euler_sample(velocity, noise, flow.sampling_times(7, 0.58125))
    torch.testing.assert_close(x0, target, atol=1e-5, rtol=0)


def test_cfg_uses_krea_convention_and_one_batched_call():
    calls = []
    cond, neg = torch.full((2, 1, 1, 1), 2.0), torch.full((1, 1, 1, 1), 0.5)
    txt, _ = with_negative(cond, None, neg, None)  # [2, 2, 0.5, 0.5]

    def paired(x, t):  # v_c = 2 on the first half, v_u = 0.5 on the second
        calls.append(x.shape[0])
        return txt.view(-1, 1, 1, 1).expand_as(x).clone()

    noise = torch.zeros(2, 1, 1, 1)
    x = euler_sample(with_cfg(paired, 3.0), noise, torch.tensor([1.0, 0.0]))
    # x = 0 + (0 - 1) * (2 + 3 * (2 - 0.5)) = -6.5
    torch.testing.assert_close(x, torch.full_like(x, -6.5))
    assert calls == [4]


def test_with_negative_broadcasts_one_negative_and_fills_missing_masks():
    txt, neg = torch.randn(3, 5, 2, 4), torch.randn(1, 5, 2, 4)
    mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3, [True] * 4 + [False]])
    txt2, mask2 = with_negative(txt, mask, neg, None)
    assert txt2.shape == (6, 5, 2, 4) and torch.equal(txt2[3:], neg.expand(3, -1, -1, -1))
    assert torch.equal(mask2[:3], mask) and bool(mask2[3:].all())
    assert with_negative(txt, None, neg, None)[1] is None


def test_euler_step_is_one_step_of_euler_sample():
    def velocity(x, t):
        return x * t.view(-1, 1, 1, 1) + 1

    noise = seeded_noise([3, 4], (2, 4, 4))
    times = torch.tensor([1.0, 0.6, 0.0], dtype=torch.float64)
    x = noise.float()
    for t, t_next in zip(times[:-1].tolist(), times[1:].tolist(), strict=True):
        x = euler_step(velocity, x, t, t_next, noise.dtype)
    assert torch.equal(x, euler_sample(velocity, noise, times))


def test_cfg_over_the_dit_is_one_batched_euler_loop():
    """The sampler contract reproduces, bit for bit, Euler with Krea CFG written out by hand:
    one forward over [prompts; negative] per step, v_c + w (v_c - v_u), fp32 state."""
    model = Krea2DiT.from_config("toy", depth=1).eval()
    randomize(model, seed=1)
    txt, mask = torch.randn(2, 6, 3, 64), torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    neg_txt, neg_mask = torch.randn(1, 6, 3, 64), torch.ones(1, 6, dtype=torch.bool)
    noise, times = seeded_noise([0, 1], (3, 16, 16)), flow.sampling_times(3, 0.5)
    txt2, mask2 = with_negative(txt, mask, neg_txt, neg_mask)
    got = euler_sample(with_cfg(dit_velocity(model, txt2, mask2), 2.0), noise, times)
    x = noise.clone()
    with torch.no_grad():
        for i in range(len(times) - 1):
            t = torch.full((4,), float(times[i]))
            v = model.velocity(torch.cat([x, x]), txt2, t, mask2)
            dt = float(times[i + 1]) - float(times[i])
            x = x + dt * flow.guided_velocity(v[:2], v[2:], 2.0)
    assert torch.equal(got, x)


def test_generate_runs_the_negative_only_with_cfg():
    model = Krea2DiT.from_config("toy", depth=1).eval()
    batches, forward = [], model.velocity

    def counting(x, *args, **kwargs):
        batches.append(x.shape[0])
        return forward(x, *args, **kwargs)

    model.velocity = counting

    class Encoder:
        def encode(self, prompts):
            return torch.randn(len(prompts), 4, 3, 64), torch.ones(len(prompts), 4, dtype=bool)

    generate(model, Encoder(), PixelAE(), ["a", "b"], 16, 16, steps=2, cfg=0.0)
    assert batches == [2, 2]  # w = 0 skips the negative pass
    batches.clear()
    generate(model, Encoder(), PixelAE(), ["a", "b"], 16, 16, steps=2, cfg=2.0)
    assert batches == [4, 4]


def test_seeded_noise_is_per_image():
    a = seeded_noise([5, 6, 7], (4, 8, 8))
    b = seeded_noise([7], (4, 8, 8))
    torch.testing.assert_close(a[2], b[0], rtol=0, atol=0)
    assert not torch.equal(a[0], a[1])


def test_patchify_layout_and_positions_equal_the_pipeline():
    lat = torch.randn(2, 16, 6, 10)
    ref = lat.view(2, 16, 3, 2, 5, 2).permute(0, 2, 4, 1, 3, 5).reshape(2, 15, 64)
    torch.testing.assert_close(patchify(lat, 2), ref, rtol=0, atol=0)
    torch.testing.assert_close(unpatchify(patchify(lat, 2), 2, 6, 10), lat, rtol=0, atol=0)
    want = Krea2Pipeline.prepare_position_ids(7, 3, 5, torch.device("cpu"))
    torch.testing.assert_close(image_positions(7, 3, 5), want, rtol=0, atol=0)
