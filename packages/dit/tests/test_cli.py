"""`krea2 dit sample|convert|flops` end to end on a toy checkpoint (CPU)."""

from __future__ import annotations

import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from krea2.dit.cli import app
from krea2.dit.model import Krea2DiT
from krea2.dit.weights import save_weights
from krea2.infra.errors import UserError

runner = CliRunner()


@pytest.fixture(scope="module")
def toy_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "toy.safetensors"
    save_weights(Krea2DiT.from_config("toy", depth=2), path)
    return path


def test_sample_writes_one_png_per_prompt(toy_ckpt, tmp_path):
    args = ["sample", "--weights", str(toy_ckpt), "--prompt", "a red circle", "--prompt",
            "a blue square", "--size", "32x16", "--steps", "2", "--cfg", "2", "--seed", "7",
            "--text-tokens", "16", "--device", "cpu", "--out", str(tmp_path / "out")]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    paths = sorted((tmp_path / "out").glob("*.png"))
    assert [p.name for p in paths] == ["000-seed7.png", "001-seed8.png"]
    assert Image.open(paths[0]).size == (32, 16)
    # Same seed, same image: sampling is reproducible per image.
    res = runner.invoke(app, [*args[:-1], str(tmp_path / "again")])
    assert res.exit_code == 0
    again = (tmp_path / "again" / "001-seed8.png").read_bytes()
    assert again == paths[1].read_bytes()


def test_sample_rejects_a_size_off_the_patch_grid(toy_ckpt, tmp_path):
    res = runner.invoke(app, ["sample", "--weights", str(toy_ckpt), "--prompt", "x", "--size",
                              "30x32", "--out", str(tmp_path)])  # fmt: skip
    assert isinstance(res.exception, UserError)
    assert "30x32 is not divisible by 4" in str(res.exception)


def test_sample_names_components_by_the_registry(toy_ckpt, tmp_path):
    base = ["sample", "--weights", str(toy_ckpt), "--prompt", "x", "--out", str(tmp_path)]
    res = runner.invoke(app, [*base, "--ae", "qwen:/models/qwen-image"])
    assert isinstance(res.exception, UserError)
    assert "write 'qwen-image:/models/qwen-image'" in str(res.exception)
    res = runner.invoke(app, [*base, "--text-encoder", "/models/Qwen3-VL-4B-Instruct"])
    assert isinstance(res.exception, UserError)
    assert "qwen3-vl:PATH" in str(res.exception)


def test_convert_round_trip(toy_ckpt, tmp_path):
    res = runner.invoke(app, ["convert", "--to", "diffusers", str(toy_ckpt), str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "d" / "config.json").exists()
    res = runner.invoke(app, ["convert", "--to", "onnx", str(toy_ckpt), str(tmp_path / "x")])
    assert isinstance(res.exception, UserError)


def test_flops_prints_the_release_parameter_count():
    res = runner.invoke(app, ["flops", "--config", "krea2-12b", "--size", "1024x1024"])
    assert res.exit_code == 0
    assert "12,820,073,036 parameters" in res.output
    res = runner.invoke(app, ["flops", "--config", "toy", "--size", "32x32", "--ae-factor", "1",
                              "--text-tokens", "16", "--json"])  # fmt: skip
    d = json.loads(res.output)
    assert d["image_tokens"] == 64 and d["train_flops"] > 2 * d["forward_flops"]
