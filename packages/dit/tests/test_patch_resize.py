"""Patch-size resize: a model moved from patch p to 2p is its own upsampled self."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from krea2.dit.config import get_config
from krea2.dit.model import Krea2DiT
from krea2.dit.patch_resize import resize_patch_weights
from krea2.infra.errors import UserError


def test_a_doubled_patch_on_a_doubled_image_gives_the_upsampled_velocity():
    torch.manual_seed(0)
    small = Krea2DiT(get_config("tiny"))  # patch 2
    large = Krea2DiT(get_config("tiny", patch=4))
    state = resize_patch_weights(small.state_dict(), 2, 4, small.cfg.latent_channels)
    large.load_state_dict(state)
    c = small.cfg.latent_channels
    x = torch.randn(2, c, 6, 8)  # a 3x4 token grid at patch 2
    up = F.interpolate(x, scale_factor=2, mode="nearest")  # the same grid at patch 4
    txt = torch.randn(2, 3, small.cfg.text_taps, small.cfg.text_dim)
    t = torch.tensor([0.3, 0.8])
    expected = F.interpolate(small.velocity(x, txt, t), scale_factor=2, mode="nearest")
    torch.testing.assert_close(large.velocity(up, txt, t), expected, rtol=1e-5, atol=1e-5)
    # Only the pixel-facing layers change.
    changed = {k for k, v in state.items() if v.shape != small.state_dict()[k].shape}
    assert changed == {"first.weight", "last.linear.weight", "last.linear.bias"}


def test_resizing_up_then_down_restores_the_weights_and_keeps_a_prefix():
    torch.manual_seed(0)
    state = {f"dit.{k}": v for k, v in Krea2DiT(get_config("tiny")).state_dict().items()}
    there = resize_patch_weights(state, 2, 6, 4, prefix="dit.")
    assert there["dit.first.weight"].shape[1] == 4 * 36
    back = resize_patch_weights(there, 6, 2, 4, prefix="dit.")
    for k, v in state.items():
        torch.testing.assert_close(back[k], v, rtol=1e-6, atol=1e-7)


def test_a_patch_change_that_does_not_divide_or_a_wrong_state_is_refused():
    state = Krea2DiT(get_config("tiny")).state_dict()
    with pytest.raises(UserError, match="one patch size must divide the other"):
        resize_patch_weights(state, 2, 3, 4)
    with pytest.raises(UserError, match="expected 36"):
        resize_patch_weights(state, 3, 6, 4)
    with pytest.raises(UserError, match=r"no 'dit\.first\.weight'"):
        resize_patch_weights(state, 2, 4, 4, prefix="dit.")
