"""The component registry: spec parsing and its errors, latent shapes, loading by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from krea2.dit.components import (
    ComponentSpec,
    LatentSpace,
    latent_space,
    load_autoencoder,
    load_text_encoder,
    parse_autoencoder,
    parse_text_encoder,
)
from krea2.dit.config import get_config
from krea2.dit.pixel_ae import PixelAE
from krea2.dit.vae import Flux2VAE, QwenImageVAE
from krea2.infra.errors import UserError


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("pixel", ComponentSpec("pixel")),
        ("pixel:2", ComponentSpec("pixel", number=2)),
        ("qwen-image:/m/qwen", ComponentSpec("qwen-image", path=Path("/m/qwen"))),
        ("flux2:/m/flux2", ComponentSpec("flux2", path=Path("/m/flux2"))),
    ],
)
def test_autoencoder_specs_parse_and_print_back(spec, parsed):
    assert parse_autoencoder(spec) == parsed
    assert str(parsed) == spec


def test_text_encoder_specs_parse():
    assert parse_text_encoder("qwen3-vl:/m/q") == ComponentSpec("qwen3-vl", path=Path("/m/q"))
    assert parse_text_encoder("tiny").number is None
    assert parse_text_encoder("tiny:7").number == 7


def test_an_unknown_name_lists_the_valid_ones():
    with pytest.raises(UserError) as err:
        parse_autoencoder("vqgan:/m")
    msg = str(err.value)
    assert "'vqgan:/m'" in msg
    for usage in ("pixel[:F]", "qwen-image:PATH", "flux2:PATH"):
        assert usage in msg
    with pytest.raises(UserError, match=r"use one of: words, qwen3-vl:PATH, tiny\[:SEED\]"):
        parse_text_encoder("word", also=["words"])


def test_the_old_qwen_spelling_names_the_new_one():
    with pytest.raises(UserError, match="'qwen' is now named 'qwen-image'; write 'qwen-image:/m'"):
        parse_autoencoder("qwen:/m")


def test_a_bare_folder_asks_for_kind_and_path():
    with pytest.raises(UserError, match="a local folder is written KIND:PATH"):
        parse_text_encoder("/models/Qwen3-VL-4B-Instruct")


def test_path_kinds_need_a_path_and_number_kinds_a_number():
    with pytest.raises(UserError, match="needs a local path: write 'qwen-image:PATH'"):
        parse_autoencoder("qwen-image")
    with pytest.raises(UserError, match="'x' is not a whole number; write 'pixel\\[:F\\]'"):
        parse_autoencoder("pixel:x")


def test_latent_space_of_pixel_needs_no_weights():
    assert latent_space("pixel") == LatentSpace(3, 1)
    assert latent_space("pixel:2") == LatentSpace(12, 2)


@pytest.mark.parametrize(("kind", "cls"), [("qwen-image", QwenImageVAE), ("flux2", Flux2VAE)])
def test_vaes_by_name_latent_shape_from_config_then_weights(kind, cls, tmp_path):
    ae = cls.tiny()
    ae.vae.save_pretrained(tmp_path / "vae")
    assert latent_space(f"{kind}:{tmp_path}") == LatentSpace(ae.latent_channels, ae.spatial_factor)
    loaded = load_autoencoder(f"{kind}:{tmp_path}", dtype=torch.float32)
    assert isinstance(loaded, cls) and not loaded.training
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    torch.testing.assert_close(loaded.encode(x), ae.encode(x))
    with pytest.raises(UserError, match=r"has no config\.json"):
        latent_space(f"{kind}:{tmp_path / 'missing'}")


def test_pixel_by_name_is_a_frozen_pixel_ae():
    ae = load_autoencoder("pixel:2")
    assert isinstance(ae, PixelAE) and ae.spatial_factor == 2 and not ae.training


def test_tiny_text_encoder_by_name_fits_the_dit_and_takes_the_callers_vocabulary():
    dit = get_config("toy")
    enc = load_text_encoder("tiny:3", dit, max_length=16, corpus=["a zebra"] * 8)
    assert (enc.hidden_size, len(enc.taps), enc.max_length) == (dit.text_dim, dit.text_taps, 16)
    assert len(enc.tokenizer("a zebra").input_ids) == 2
    states, mask = enc.encode(["a zebra"])
    assert states.shape == (1, 16, dit.text_taps, dit.text_dim) and mask.shape == (1, 16)
    again = load_text_encoder("tiny:3", dit, max_length=16, corpus=["a zebra"] * 8)
    assert torch.equal(again.encode(["a zebra"])[0], states)  # the seed fixes the weights
