"""Bad input gets one clear error naming the problem."""

from __future__ import annotations

import pytest
import torch

from krea2.dit.config import DiTConfig, get_config
from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import PixelAE
from krea2.dit.testing import make_inputs
from krea2.infra.errors import UserError


@pytest.fixture
def model(tiny_cfg):
    return Krea2DiT(tiny_cfg)


def test_wrong_latent_channels(model):
    with pytest.raises(
        UserError, match="latents have 3 channels but config 'tiny' expects latent_channels=4"
    ):
        model.velocity(torch.randn(1, 3, 4, 4), torch.randn(1, 2, 3, 16), torch.rand(1))


def test_size_not_divisible_by_patch(model):
    with pytest.raises(UserError, match="latent size 5x4 is not divisible by patch=2"):
        model.velocity(torch.randn(1, 4, 5, 4), torch.randn(1, 2, 3, 16), torch.rand(1))


def test_wrong_packed_features_and_text_shape(model, tiny_cfg):
    img, txt, t, pos, mask = make_inputs(tiny_cfg)
    with pytest.raises(UserError, match=r"img must be \[B, N, 16\]"):
        model(img[..., :8], txt, t, pos, mask)
    with pytest.raises(UserError, match=r"txt must be \[B=2, T, taps=3, text_dim=16\]"):
        model(img, txt[:, :, :2], t, pos, mask)
    with pytest.raises(UserError, match=r"pos must be \[T\+N=22, 3\]"):
        model(img, txt, t, pos[:-1], mask)
    with pytest.raises(UserError, match=r"txt_mask must be \[B, T\]"):
        model(img, txt, t, pos, mask[:, :-1])


def test_dtype_mismatch(model, tiny_cfg):
    img, txt, t, pos, mask = make_inputs(tiny_cfg)
    with pytest.raises(UserError, match=r"img dtype torch\.bfloat16 differs from the model's"):
        model(img.bfloat16(), txt, t, pos, mask)


def test_bad_config_fields_are_named():
    with pytest.raises(UserError, match="heads=6 is not divisible by kv_heads=4"):
        get_config("tiny", heads=6, width=48, kv_heads=4)
    with pytest.raises(UserError, match="unknown DiT config 'huge'"):
        get_config("huge")
    with pytest.raises(UserError, match=r"rope_fraction=1\.5"):
        DiTConfig(rope_fraction=1.5)


def test_pixel_ae_rejects_bad_images():
    ae = PixelAE(factor=2)
    with pytest.raises(UserError, match="not divisible by the autoencoder factor 2"):
        ae.encode(torch.zeros(1, 3, 5, 4))
    with pytest.raises(UserError, match=r"pixels must be \[B, 3, H, W\]"):
        ae.encode(torch.zeros(1, 1, 4, 4))


def test_pixel_ae_round_trip():
    x = torch.rand(2, 3, 8, 12) * 2 - 1
    for f in (1, 2, 4):
        ae = PixelAE(factor=f)
        z = ae.encode(x)
        assert z.shape == (2, 3 * f * f, 8 // f, 12 // f) and ae.latent_channels == 3 * f * f
        torch.testing.assert_close(ae.decode(z), x, rtol=0, atol=0)
    assert PixelAE().decode(torch.full((1, 3, 2, 2), 5.0)).max() == 1.0
