"""A model folder as a new user meets it: diffusers loads the tiny folder, its DiT config is
read without a tensor, a misspelt override or a text encoder of another shape is one line
naming the field, and no command prints torchao's import-time notices."""

from __future__ import annotations

import enum
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from krea2.dit.components import TextShape, check_text_shape, text_shape
from krea2.dit.config import get_config
from krea2.dit.release import read_dit_config
from krea2.dit.testing import write_tiny_model_folder
from krea2.dit.weights import CheckpointError, read_checkpoint, save_weights
from krea2.infra.errors import UserError

KREA2 = str(Path(sys.executable).parent / "krea2")
# What torch, torchao and diffusers print when transformers or diffusers import torchao.
NOTICES = ("register_constant()", "Unable to import `torchao` Tensor objects")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_tiny_model_folder(tmp_path_factory.mktemp("model") / "tiny-model")


def test_the_tiny_folder_names_every_pipeline_component(folder):
    index = json.loads((folder / "model_index.json").read_text())
    for part in ("scheduler", "text_encoder", "tokenizer", "transformer", "vae"):
        library, _ = index[part]
        assert library in ("diffusers", "transformers") and (folder / part).is_dir(), part


def test_diffusers_loads_the_tiny_folder_offline_and_draws(folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from diffusers import Krea2Pipeline, Krea2Transformer2DModel

    pipe = Krea2Pipeline.from_pretrained(folder)
    assert isinstance(pipe.transformer, Krea2Transformer2DModel)
    images = pipe(
        "a red circle", height=32, width=32, num_inference_steps=2, output_type="pt",
        max_sequence_length=16, generator=torch.Generator().manual_seed(0),
    ).images  # fmt: skip
    assert images.shape == (1, 3, 32, 32) and torch.isfinite(images).all()


def test_the_dit_config_of_a_model_folder_is_its_transformer_s(folder):
    cfg = read_dit_config(folder)
    want = get_config("tiny", text_taps=12, latent_channels=16)
    assert (cfg.width, cfg.depth, cfg.text_taps, cfg.text_dim, cfg.latent_channels) == (
        want.width, want.depth, 12, want.text_dim, 16,
    )  # fmt: skip
    assert read_dit_config(folder / "transformer") == cfg


def test_the_dit_config_of_a_safetensors_file_comes_from_its_header_alone(folder, tmp_path):
    sd, cfg = read_checkpoint(folder / "transformer")
    path = save_weights(sd, tmp_path / "bare.safetensors")  # no config in the metadata
    header = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    truncated = tmp_path / "header-only.safetensors"
    truncated.write_bytes(path.read_bytes()[: header + 1])  # the tensors' bytes are gone
    got = read_dit_config(truncated)
    assert (got.width, got.depth, got.text_taps, got.latent_channels, got.mlp_hidden_size) == (
        cfg.width, cfg.depth, cfg.text_taps, cfg.latent_channels, cfg.mlp_hidden_size,
    )  # fmt: skip
    with pytest.raises(CheckpointError):
        read_checkpoint(truncated)  # reading the weights would fail


def test_a_training_checkpoint_is_no_released_dit(tmp_path):
    step = tmp_path / "checkpoints" / "lora" / "step-000000009"
    step.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="is a training checkpoint"):
        read_dit_config(step)


def test_a_misspelt_override_names_the_closest_field():
    with pytest.raises(
        UserError, match=r"^widht is not a DiT config field; did you mean 'width'\?$"
    ):
        get_config("tiny", widht=64)
    with pytest.raises(UserError, match=r"^text_taps = '12' must be a whole number$"):
        get_config("tiny", text_taps="12")
    with pytest.raises(UserError, match="attn_gate = 1 must be true or false"):
        get_config("tiny", attn_gate=1)
    assert get_config("tiny", norm_eps=1).norm_eps == 1  # a whole number is a number


def test_a_text_encoder_s_shape_is_read_from_its_config(folder):
    spec = f"qwen3-vl:{folder / 'text_encoder'}"
    assert text_shape(spec, get_config("tiny")) == TextShape(taps=12, dim=16)
    assert text_shape("tiny:3", get_config("toy")) == TextShape(taps=3, dim=64)


def test_a_text_encoder_of_another_shape_names_text_taps_and_text_dim(folder):
    spec = f"qwen3-vl:{folder / 'text_encoder'}"
    with pytest.raises(UserError, match=r"gives 12 taps x 16 .* text_taps=3, text_dim=16"):
        check_text_shape(spec, text_shape(spec, get_config("tiny")), get_config("tiny"))


def test_the_import_notice_filters_drop_only_torchao_s_notices():
    from krea2.infra.quiet import DIFFUSERS_TORCHAO_LOGGER, PYTREE_LOGGER, drop_import_notices

    class Other(enum.Enum):
        A = 1

    drop_import_notices()
    pytree, diffusers = (
        logging.getLogger(PYTREE_LOGGER),
        logging.getLogger(DIFFUSERS_TORCHAO_LOGGER),
    )

    def record(logger, msg, *args):
        return logger.makeRecord(logger.name, logging.WARNING, "f", 1, msg, args, None)

    enum_msg = "%s is an Enum subclass and is now natively supported by torch.compile"
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    assert not pytree.filter(record(pytree, enum_msg, KernelPreference))  # torchao's own
    assert pytree.filter(record(pytree, enum_msg, Other))  # anyone else's enum still warns
    assert pytree.filter(record(pytree, "something else"))
    assert not diffusers.filter(record(diffusers, "Unable to import `torchao` Tensor objects."))
    assert diffusers.filter(record(diffusers, "another diffusers warning"))


def _stderr(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [KREA2, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


@pytest.mark.parametrize("args", [["dit", "sample", "--help"], ["train", "--help"]])
def test_help_prints_no_import_notices(args):
    stderr = _stderr(*args)
    assert not [n for n in NOTICES if n in stderr], stderr


def test_sampling_a_model_folder_prints_no_import_notices(folder, tmp_path):
    """`dit sample --model` imports transformers' Qwen3-VL and diffusers' VAE, which import
    torchao: its notices used to come first on stderr."""
    stderr = _stderr(
        "dit", "sample", "--model", str(folder), "--prompt", "a red circle", "--size", "16x16",
        "--steps", "1", "--cfg", "0", "--text-tokens", "16", "--device", "cpu",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert not [n for n in NOTICES if n in stderr], stderr
