"""The model's arithmetic does not depend on what autograd will do with it (issue #36).

A preference or RL objective compares the policy with a frozen copy of itself; at the start
they must agree to the bit, whichever kernels the CPU picks (marker ``numerics``; rerun
under other instruction sets and thread counts by scripts/numerics_matrix.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import to_uint8
from krea2.dit.testing import randomize

pytestmark = pytest.mark.numerics


def inputs(cfg, batch: int = 4):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, cfg.latent_channels, 32, 32, generator=g)
    txt = torch.randn(batch, 12, cfg.text_taps, cfg.text_dim, generator=g)
    mask = torch.ones(batch, 12, dtype=torch.bool)
    mask[:, 8:] = False  # padded text: the masked path too
    return x, txt, torch.rand(batch, generator=g), mask


def test_a_frozen_copy_computes_the_same_velocity_as_the_trainable_model():
    policy = Krea2DiT.from_config("toy", depth=2)
    randomize(policy, seed=0, std=0.05)  # no zero-initialised layer hides a path
    frozen = copy.deepcopy(policy).requires_grad_(False)
    x, txt, t, mask = inputs(policy.cfg)
    with torch.no_grad():
        ref = frozen.velocity(x, txt, t, mask)
    with_grad = policy.velocity(x.clone().requires_grad_(True), txt, t, mask)
    assert torch.equal(with_grad.detach(), ref)
    with torch.no_grad():
        assert torch.equal(policy.velocity(x, txt, t, mask), ref)


def test_decoded_images_are_c_contiguous():
    images = to_uint8(torch.rand(2, 3, 8, 6) * 2 - 1)
    assert images.shape == (2, 8, 6, 3) and images.is_contiguous()
    assert images.numpy().flags["C_CONTIGUOUS"]
