"""TDM's pieces as specifications: krea2's CFG convention against Ho's, the student's step
intervals and re-noising, importance weights, Pseudo-Huber limits, DMD's normaliser, and the
settings' checks."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from krea2.dit import flow
from krea2.dit.sampler import euler_sample
from krea2.rl.distill import (
    DistillMode,
    Intervals,
    TdmConfig,
    draw_points,
    fake_score_loss,
    importance_weight,
    krea_guidance,
    normalised_dmd_gradient,
    pseudo_huber,
    renoise,
    rollout_inputs,
    snr_weight,
    stage_intervals,
    student_loss,
    teacher_terms,
    x0_from_velocity,
)
from krea2.rl.distill.trajectory import T_MAX, T_MIN


def _gens(n: int, offset: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(offset + i) for i in range(n)]


# ---------------------------------------------------------------- the CFG convention
@pytest.mark.parametrize("g", [1.0, 2.0, 4.0, 7.5])
def test_krea_cfg_at_g_minus_one_is_hos_cfg_at_g(g):
    v_c, v_u = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    ho = v_u + g * (v_c - v_u)
    assert torch.allclose(flow.guided_velocity(v_c, v_u, krea_guidance(g)), ho, atol=1e-6)


def test_the_teacher_guidance_is_given_in_hos_convention():
    cfg = TdmConfig()
    assert cfg.teacher_guidance == 4.0 and cfg.krea_guidance == 3.0  # krea2's scale 3
    with pytest.raises(ValueError, match=r"w=0 is teacher_guidance=1"):
        TdmConfig(teacher_guidance=0.0)  # someone writing krea2's w = 0 for "no CFG"


def test_teacher_x0_with_cfg_is_the_x0_of_krea2s_guided_velocity():
    gen = torch.Generator().manual_seed(1)
    x, v_c, v_u, v_f = torch.randn(4, 2, 3, 8, 8, generator=gen)
    t = torch.tensor([0.3, 0.8])
    w = krea_guidance(4.0)
    terms = teacher_terms(x0_from_velocity(x, t, v_c), x0_from_velocity(x, t, v_u),
                          x0_from_velocity(x, t, v_f), w)  # fmt: skip
    guided = x0_from_velocity(x, t, flow.guided_velocity(v_c, v_u, w))
    assert torch.allclose(terms.x0_teacher_cfg, guided, atol=1e-5)
    assert torch.allclose(terms.delta, guided - x0_from_velocity(x, t, v_f), atol=1e-5)


def test_split_terms_at_unit_weights_are_the_combined_offset():
    gen = torch.Generator().manual_seed(2)
    c, u, f = torch.randn(3, 2, 3, 4, 4, generator=gen)
    both = teacher_terms(c, u, f, 3.0)
    split = teacher_terms(c, u, f, 3.0, split=True)
    assert torch.allclose(both.delta, split.delta)
    only_cfg = teacher_terms(c, u, f, 3.0, split=True, cfg_weight=1.0, dm_weight=0.0)
    assert torch.allclose(only_cfg.delta, 3.0 * (c - u))


# ---------------------------------------------------------------- the student's grid
@pytest.mark.parametrize("steps", [1, 2, 4, 8])
@pytest.mark.parametrize("mu", [0.0, 0.58, 1.15])
def test_step_intervals_are_disjoint_and_cover_0_to_1(steps, mu):
    spans = stage_intervals(flow.sampling_times(steps, mu))
    assert len(spans) == steps
    assert spans[0][1] == pytest.approx(1.0) and spans[-1][0] == pytest.approx(0.0)
    for (lo, hi), (_, hi_next) in itertools.pairwise(spans):
        assert lo < hi and hi_next == lo  # touching ends only: no overlap, no gap
    assert sum(hi - lo for lo, hi in spans) == pytest.approx(1.0)


def test_disjoint_draws_stay_inside_their_steps_interval():
    times = flow.sampling_times(4, 1.15)
    spans = stage_intervals(times)
    pts = draw_points(_gens(400), times, (1, 2, 2), DistillMode.TDM, Intervals.DISJOINT, True)
    assert set(pts.stage.tolist()) == {0, 1, 2, 3}
    for k, t_in, s, tau in zip(pts.stage.tolist(), pts.t_in, pts.t_mid, pts.t_query, strict=True):
        lo, hi = spans[k]
        assert float(t_in) == pytest.approx(hi)
        assert lo - 1e-6 <= float(s) <= float(tau) + 1e-6 and float(tau) <= hi + 1e-6
        assert T_MIN - 1e-6 <= float(tau) <= T_MAX + 1e-6


def test_shared_draws_reach_past_their_interval_and_dmd2_draws_cover_all_times():
    times = flow.sampling_times(4, 1.15)
    spans = stage_intervals(times)
    shared = draw_points(_gens(200), times, (1,), DistillMode.TDM, Intervals.SHARED, True)
    above = [float(t) > spans[k][1] for k, t in zip(shared.stage.tolist(), shared.t_query,
                                                     strict=True)]  # fmt: skip
    assert any(above) and bool((shared.t_query >= shared.t_mid - 1e-6).all())
    dmd2 = draw_points(_gens(200), times, (1,), DistillMode.DMD2, Intervals.DISJOINT, True)
    assert bool((dmd2.t_mid == 0).all())
    assert float(dmd2.t_query.min()) < 0.2 and float(dmd2.t_query.max()) > 0.8


def test_draws_depend_only_on_each_samples_generator():
    times = flow.sampling_times(4, 0.5)
    whole = draw_points(_gens(6), times, (2, 2), DistillMode.TDM, Intervals.DISJOINT, True)
    half = draw_points(_gens(3, 3), times, (2, 2), DistillMode.TDM, Intervals.DISJOINT, True)
    assert torch.equal(whole.t_query[3:], half.t_query) and torch.equal(whole.noise[3:], half.noise)


def test_rollout_inputs_are_krea2s_euler_states():
    def velocity(x, t):  # any smooth velocity field
        return torch.sin(x) * t.view(-1, 1, 1, 1) - 0.3 * x

    noise = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(3))
    times = flow.sampling_times(4, 0.8)
    states = rollout_inputs(velocity, noise, times)
    assert len(states) == 4 and torch.equal(states[0], noise)
    assert torch.allclose(states[2], euler_sample(velocity, noise, times[:3]), atol=1e-6)


def test_renoise_keeps_the_signal_coefficient_and_the_noise_level():
    gen = torch.Generator().manual_seed(4)
    x0, eps, n = torch.randn(3, 2, 4, 64, 64, generator=gen)
    s, tau = torch.tensor([0.2, 0.5]), torch.tensor([0.4, 0.9])
    x_tau, mixed = renoise(x0, eps, s, tau, n)
    assert torch.allclose(x_tau, (1 - tau.view(-1, 1, 1, 1)) * x0 + tau.view(-1, 1, 1, 1) * mixed,
                          atol=1e-5)  # fmt: skip
    assert mixed.std(dim=(1, 2, 3)).tolist() == pytest.approx([1.0, 1.0], abs=0.02)
    _, m0 = renoise(x0, eps, torch.zeros(2), tau, n)  # s = 0: DMD's fresh noise
    assert torch.allclose(m0, n, atol=1e-6)


# ---------------------------------------------------------------- weights and distances
def test_importance_weights_are_one_for_gaussian_noise_and_clipped():
    n = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    w, clipped = importance_weight(n, n, clip=2.0)
    assert torch.allclose(w, torch.ones(2)) and not clipped.any()
    # a mixed noise of near-zero norm: weight exp(mean n² / 2) ≈ 1.65, over a clip of 1.2
    w, clipped = importance_weight(0.01 * n, n, clip=1.2)
    assert torch.allclose(w, torch.full((2,), 1.2)) and clipped.all()


def test_pseudo_huber_tends_to_l2_for_small_errors_and_l1_for_large():
    d = torch.tensor([1e-4, -3e-4, 2.0, -5.0])
    small = pseudo_huber(d[:2], c=1.0)
    assert torch.allclose(small, d[:2].square() / 2.0, rtol=1e-3)
    large = pseudo_huber(d[2:], c=1e-4)
    assert torch.allclose(large, d[2:].abs(), rtol=1e-3)
    assert torch.equal(pseudo_huber(d, None), d.square())


def test_the_dmd_step_is_invariant_to_the_latents_scale():
    gen = torch.Generator().manual_seed(6)
    x0, cfg_x0, fake = torch.randn(3, 2, 3, 8, 8, generator=gen)

    def student_grad(scale: float) -> torch.Tensor:
        x = (scale * x0).requires_grad_(True)
        terms = teacher_terms(scale * cfg_x0, None, scale * fake, 0.0)
        norm = (x.detach() - terms.x0_teacher_cfg).abs().flatten(1).mean(1)
        student_loss(x, terms.delta, norm, None).sum().backward()
        # the squared distance's gradient is the normalised DMD step, 2 / elements of it
        step = normalised_dmd_gradient(terms.delta, norm)
        assert torch.allclose(x.grad, 2 * step / x0[0].numel(), atol=1e-7)
        return x.grad

    assert torch.allclose(student_grad(1.0), student_grad(37.0), atol=1e-7)


def test_the_student_moves_towards_the_teacher_and_away_from_the_fake():
    x0 = torch.zeros(1, 1, 2, 2, requires_grad=True)
    teacher, fake = torch.ones(1, 1, 2, 2), -torch.ones(1, 1, 2, 2)
    terms = teacher_terms(teacher, None, fake, 0.0)
    student_loss(x0, terms.delta, torch.ones(1), 1e-3).sum().backward()
    assert bool((x0.grad < 0).all())  # a descent step raises x0 towards the teacher


def test_fake_score_loss_weights_by_capped_snr():
    t = torch.tensor([0.01, 0.5, 0.9])
    assert snr_weight(t, 5.0).tolist() == pytest.approx([5.0, 1.0, (0.1 / 0.9) ** 2])
    x0 = torch.ones(3, 1, 2, 2)
    per = fake_score_loss(torch.zeros(3, 1, 2, 2), x0, t, torch.tensor([1.0, 2.0, 1.0]), 5.0)
    assert per.tolist() == pytest.approx([5.0, 2.0, (0.1 / 0.9) ** 2])


# ---------------------------------------------------------------- settings
def test_fake_updates_default_to_each_modes_ratio():
    assert TdmConfig().fake_updates == 1
    assert TdmConfig(mode="dmd2").fake_updates == 5
    assert TdmConfig(mode="dmd2", fake_updates=2).fake_updates == 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("student_steps", 0, "student_steps=0 must be at least 1"),
        ("huber_c", 0.0, "huber_c=0.0 must be > 0"),
        ("fake_lr", -1.0, "fake_lr=-1.0 must be > 0"),
        ("weight_clip", 0.0, "weight_clip=0.0 must be > 0"),
        ("intervals", "sliding", "'sliding' is not a valid Intervals"),
        ("cfg_weight", 0.5, "set split_teacher_term = true"),
    ],
)
def test_bad_settings_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        TdmConfig(**{field: value})
    assert math.isfinite(TdmConfig().huber_c)
