"""Diffusion-DPO and STPO losses on velocity errors: values, signs and what each term pulls."""

from __future__ import annotations

import math

import pytest
import torch

from krea2.rl.preference import PreferenceConfig, pair_terms, time_weight

pytestmark = pytest.mark.numerics  # exact values at the reference (scripts/numerics_matrix.py)

T = torch.tensor([0.3, 0.7])


def _grads(cfg, e_w, e_l, e_ref_w, e_ref_l):
    e_w = torch.tensor(e_w, requires_grad=True)
    e_l = torch.tensor(e_l, requires_grad=True)
    terms = pair_terms(cfg, e_w, e_l, torch.tensor(e_ref_w), torch.tensor(e_ref_l), T)
    terms.loss.sum().backward()
    return terms, e_w.grad, e_l.grad


def test_at_the_reference_the_loss_is_log_two_and_gaps_are_zero():
    e = torch.tensor([0.2, 0.5])
    for kind in ("dpo", "stpo"):
        terms = pair_terms(PreferenceConfig(kind=kind), e, e, e, e, T)
        assert torch.allclose(terms.loss, torch.full((2,), math.log(2)))
        assert terms.winner_gap.abs().max() == 0 and terms.margin.abs().max() == 0


def test_dpo_lowers_the_winner_error_and_raises_the_loser_error():
    _, g_w, g_l = _grads(PreferenceConfig(kind="dpo", beta=10), [0.2, 0.2], [0.2, 0.2],
                         [0.2, 0.2], [0.2, 0.2])  # fmt: skip
    assert (g_w > 0).all() and (g_l < 0).all()  # descent: e_w down, e_l up


def test_dpo_is_satisfied_by_both_errors_rising_stpo_is_not():
    # both branches 0.1 above the reference, the loser more: DPO's margin is met ...
    args = ([0.3, 0.3], [0.5, 0.5], [0.2, 0.2], [0.2, 0.2])
    dpo, g_w_dpo, _ = _grads(PreferenceConfig(kind="dpo", beta=100), *args)
    assert (dpo.margin > 0).all() and (dpo.winner_gap > 0).all()
    assert g_w_dpo.abs().max() < 1e-6  # ... so DPO no longer pulls the winner back
    _, g_w, g_l = _grads(PreferenceConfig(kind="stpo", beta=100, loser_cap=0.0), *args)
    assert (g_w > 1).all()  # the hinge pulls the winner's error back down
    assert g_l.abs().max() < 1e-6


def test_stpo_hinge_is_free_while_the_winner_is_at_or_below_the_reference():
    args = ([0.1, 0.1], [0.3, 0.3], [0.2, 0.2], [0.2, 0.2])
    dpo, *_ = _grads(PreferenceConfig(kind="dpo", beta=5), *args)
    stpo, *_ = _grads(PreferenceConfig(kind="stpo", beta=5, loser_margin=0.5), *args)
    assert torch.allclose(dpo.loss, stpo.loss)


def test_loser_cap_stops_the_loser_error_running_away():
    args = ([0.2, 0.2], [0.9, 0.9], [0.2, 0.2], [0.2, 0.2])
    _, _, g_l = _grads(PreferenceConfig(kind="stpo", beta=50, loser_cap=0.5, loser_margin=0.1),
                       *args)  # fmt: skip
    assert (g_l > 0).all()  # saturated DPO; the cap now lowers the loser's error


def test_margin_is_beta_times_weight_times_gap_difference_and_accuracy_its_sign():
    cfg = PreferenceConfig(kind="dpo", beta=2.0, time_weight="epsilon")
    e_w, e_l = torch.tensor([0.1, 0.4]), torch.tensor([0.3, 0.2])
    ref = torch.tensor([0.2, 0.2])
    terms = pair_terms(cfg, e_w, e_l, ref, ref, T)
    expected = 2.0 * (1 - T).square() * ((e_l - ref) - (e_w - ref))
    assert torch.allclose(terms.margin, expected)
    assert (terms.margin > 0).tolist() == [True, False]


def test_epsilon_weight_is_the_noise_error_scale():
    assert torch.allclose(time_weight("epsilon", torch.tensor([0.0, 0.5, 1.0])),
                          torch.tensor([1.0, 0.25, 0.0]))  # fmt: skip


@pytest.mark.parametrize("bad", [dict(beta=0), dict(winner_hinge=-1), dict(kind="ipo")])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        PreferenceConfig(**bad)
