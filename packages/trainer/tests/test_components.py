"""The job names its autoencoder and text encoder through krea2.dit's registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from krea2.infra.errors import UserError
from krea2.trainer.config import ModelConfig, TextConfig, load_job
from krea2.trainer.text import text_encoder_spec
from krea2.trainer.validate import autoencoder_spec, validate_job


@pytest.mark.parametrize(
    ("autoencoder", "ae_factor", "spec"),
    [
        ("pixel", None, "pixel"),
        ("pixel:2", None, "pixel:2"),
        ("pixel", 2, "pixel:2"),  # the older spelling
        ("pixel:2", 2, "pixel:2"),
        ("qwen-image:/m/vae", None, "qwen-image:/m/vae"),
        ("qwen-image:/m/vae", 1, "qwen-image:/m/vae"),  # older runs saved the default 1
    ],
)
def test_autoencoder_spec_folds_the_older_ae_factor(autoencoder, ae_factor, spec):
    assert autoencoder_spec(ModelConfig(autoencoder=autoencoder, ae_factor=ae_factor)) == spec


def test_ae_factor_that_contradicts_the_autoencoder_is_rejected():
    with pytest.raises(UserError, match="disagree; write autoencoder = 'pixel:2'"):
        autoencoder_spec(ModelConfig(autoencoder="pixel:4", ae_factor=2))
    with pytest.raises(UserError, match="applies to pixel only"):
        autoencoder_spec(ModelConfig(autoencoder="flux2:/m", ae_factor=2))


def test_old_qwen_spelling_names_the_registry_name():
    with pytest.raises(UserError, match="write 'qwen-image:/m'"):
        autoencoder_spec(ModelConfig(autoencoder="qwen:/m"))


def test_text_encoder_spec_folds_the_older_path():
    assert text_encoder_spec(TextConfig()) == "words"
    assert text_encoder_spec(TextConfig(encoder="qwen3-vl:/m/q")) == "qwen3-vl:/m/q"
    assert text_encoder_spec(TextConfig(encoder="qwen3-vl", path=Path("/m/q"))) == "qwen3-vl:/m/q"
    with pytest.raises(UserError, match=r"remove text\.path"):
        text_encoder_spec(TextConfig(encoder="qwen3-vl:/m/q", path=Path("/m/q")))
    with pytest.raises(UserError, match="use one of: words, qwen3-vl:PATH"):
        text_encoder_spec(TextConfig(encoder="word"))


def test_validate_derives_the_factor_and_channels_from_the_autoencoder(write_job):
    cfg = load_job(write_job(), ["model.autoencoder=pixel:2"])
    with pytest.raises(UserError, match="latent_channels=3 but the autoencoder pixel:2 gives 12"):
        validate_job(cfg)
    cfg = load_job(write_job(), ["model.autoencoder=pixel:3", "model.overrides.latent_channels=27"])
    with pytest.raises(UserError, match=r"resolution=32 is not divisible by .* patch = 12"):
        validate_job(cfg)


def test_validate_names_a_missing_text_encoder_folder(write_job, tmp_path):
    cfg = load_job(write_job(), [f"text.encoder=qwen3-vl:{tmp_path / 'none'}"])
    with pytest.raises(UserError, match="does not exist; give a local model"):
        validate_job(cfg)
