"""`krea2 dit sample|convert|flops` end to end on a toy checkpoint (CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from krea2.dit.cli import app
from krea2.dit.flops import format_flops
from krea2.dit.model import Krea2DiT
from krea2.dit.testing import write_tiny_model_folder
from krea2.dit.weights import save_weights
from krea2.infra.errors import UserError

runner = CliRunner()
KREA2 = str(Path(sys.executable).parent / "krea2")


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


def test_flops_are_printed_in_units_that_fit():
    assert [format_flops(x) for x in (3.41e9, 2.5e6, 1.2e13, 7e16, 120)] == [
        "3.41 GFLOP", "2.50 MFLOP", "12.00 TFLOP", "70.00 PFLOP", "120 FLOP"
    ]  # fmt: skip
    res = runner.invoke(app, ["flops", "--config", "toy", "--size", "32x32", "--ae-factor", "1",
                              "--text-tokens", "16"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "0.00" not in res.output and " MFLOP" in res.output


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A tiny folder in the diffusers Krea 2 layout (transformer/, text_encoder/, tokenizer/,
    vae/, scheduler/, model_index.json)."""
    return write_tiny_model_folder(tmp_path_factory.mktemp("release") / "krea2-tiny")


def sample_png(args, out):
    common = ["--size", "16x16", "--steps", "2", "--cfg", "1", "--text-tokens", "16"]
    res = runner.invoke(app, ["sample", *args, *common, "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return (out / "000-seed0.png").read_bytes()


def test_the_diffusers_text_encoder_folder_follows_the_prompt(release, tmp_path):
    # The layout of the issue: the tokenizer sits in the sibling tokenizer/ folder.
    parts = ["--weights", str(release / "transformer"), "--ae", f"qwen-image:{release / 'vae'}",
             "--text-encoder", f"qwen3-vl:{release / 'text_encoder'}"]  # fmt: skip
    red = sample_png([*parts, "--prompt", "a red circle"], tmp_path / "red")
    blue = sample_png([*parts, "--prompt", "a blue square"], tmp_path / "blue")
    assert red != blue


def test_a_whole_model_folder_samples_with_its_own_parts(release, tmp_path):
    parts = ["--weights", str(release / "transformer"), "--ae", f"qwen-image:{release / 'vae'}",
             "--text-encoder", f"qwen3-vl:{release}", "--prompt", "a red circle"]  # fmt: skip
    by_parts = sample_png(parts, tmp_path / "parts")
    by_model = sample_png(["--model", str(release), "--prompt", "a red circle"], tmp_path / "m")
    assert by_model == by_parts
    turbo = sample_png(["--model", str(release), "--prompt", "a red circle", "--turbo"],
                       tmp_path / "turbo")  # fmt: skip
    assert turbo != by_model  # mu 1.15 instead of the scheduler's line at 4 tokens


def test_a_distilled_model_folder_uses_the_turbo_shift(release, tmp_path):
    index = json.loads((release / "model_index.json").read_text())
    turbo = sample_png(["--model", str(release), "--prompt", "x", "--mu", "1.15"], tmp_path / "t")
    try:
        (release / "model_index.json").write_text(json.dumps(index | {"is_distilled": True}))
        distilled = sample_png(["--model", str(release), "--prompt", "x"], tmp_path / "d")
    finally:
        (release / "model_index.json").write_text(json.dumps(index))
    assert distilled == turbo


def test_a_native_release_folder_samples(release, tmp_path):
    native = write_tiny_model_folder(tmp_path / "native", layout="native")
    png = sample_png(["--model", str(native), "--prompt", "a red circle"], tmp_path / "out")
    # Same seed, same parts; no scheduler/ means the release's own shift line.
    assert png == sample_png(["--model", str(release), "--prompt", "a red circle"], tmp_path / "r")


def test_weights_with_conditioning_only_the_trainer_rebuilds_are_refused(toy_ckpt, tmp_path):
    path = save_weights(Krea2DiT.from_config("toy", depth=2), tmp_path / "run.safetensors",
                        conditioning={"text_encoder": "trainer:words"})  # fmt: skip
    res = runner.invoke(app, ["sample", "--weights", str(path), "--prompt", "x", "--out",
                              str(tmp_path / "out")])  # fmt: skip
    assert isinstance(res.exception, UserError)
    assert "'trainer:words'" in str(res.exception) and "krea2 train sample" in str(res.exception)
    assert not (tmp_path / "out").exists()


def test_a_training_checkpoint_folder_is_refused(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "pretrain" / "step-000000009"
    step.mkdir(parents=True)
    res = runner.invoke(app, ["sample", "--weights", str(step), "--prompt", "x", "--out",
                              str(tmp_path / "out")])  # fmt: skip
    assert isinstance(res.exception, UserError)
    assert f"krea2 train sample {tmp_path / 'run'} --stage pretrain" in str(res.exception)


def test_ctrl_c_while_sampling_exits_130_and_writes_no_image(toy_ckpt, tmp_path):
    out = tmp_path / "out"
    cmd = [KREA2, "dit", "sample", "--weights", str(toy_ckpt), "--prompt", "x", "--size",
           "32x32", "--steps", "1000000", "--cfg", "0", "--text-tokens", "16", "--device", "cpu",
           "--out", str(out)]  # fmt: skip
    # a plain progress line per step: the first one proves denoising is under way
    env = os.environ | {
        "KREA2_PROGRESS": "plain",
        "KREA2_PROGRESS_INTERVAL": "0",
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    seen = []
    for line in proc.stderr:  # wait until denoising reports progress (plain lines)
        seen.append(line)
        if line.startswith("sample 32x32:"):
            break
    assert proc.poll() is None, "".join(seen)
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole process group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, "".join(seen) + stderr)
    assert "interrupted" in stderr
    assert not out.exists() or list(out.iterdir()) == []
