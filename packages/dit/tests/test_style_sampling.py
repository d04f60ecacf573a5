"""Sampling with style references: specs, reference latents, generate(style=...), the CLI."""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from krea2.dit.cli import app
from krea2.dit.config import get_config
from krea2.dit.generation import generate
from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import PixelAE
from krea2.dit.release import read_dit_config, read_model_folder
from krea2.dit.sample_plan import plan_sample
from krea2.dit.sampler import dit_velocity
from krea2.dit.style_module import StyleConfig, StyleModule, StyleTokens, save_style_module
from krea2.dit.style_refs import parse_style_ref, parse_style_times, style_reference_latents
from krea2.dit.testing import randomize, write_tiny_model_folder
from krea2.dit.weights import save_weights
from krea2.infra.errors import UserError

runner = CliRunner()
KREA2 = str(Path(sys.executable).parent / "krea2")


def stripes(width=64, height=32) -> Image.Image:
    """Three vertical stripes: red, green, blue."""
    a = np.zeros((height, width, 3), dtype=np.uint8)
    third = width // 3
    a[:, :third, 0] = a[:, third : 2 * third, 1] = a[:, 2 * third :, 2] = 255
    return Image.fromarray(a)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("a.png", ("a.png", 1.0)),
        ("a.png:0.7", ("a.png", 0.7)),
        ("a.png:0", ("a.png", 0.0)),
        ("dir/b.png:2.5", ("dir/b.png", 2.5)),
        ("odd:name.png", ("odd:name.png", 1.0)),
        ("odd:name.png:0.5", ("odd:name.png", 0.5)),
    ],
)
def test_a_style_ref_is_a_path_and_an_optional_strength(spec, want):
    path, strength = parse_style_ref(spec)
    assert (str(path), strength) == want


@pytest.mark.parametrize("spec", ["a.png:-0.5", "a.png:nan", "a.png:inf", ":0.5"])
def test_bad_style_refs_are_user_errors(spec):
    with pytest.raises(UserError, match="style-ref"):
        parse_style_ref(spec)


@pytest.mark.parametrize(
    ("spec", "want"), [("0:0.8", (0.0, 0.8)), ("0.2:1", (0.2, 1.0)), ("0.5:0.5", (0.5, 0.5))]
)
def test_style_times_are_two_flow_times(spec, want):
    assert parse_style_times(spec) == want


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("0.8", "write LO:HI"),
        ("late:early", "write LO:HI"),
        ("0.8:0.2", "0 <= LO <= HI <= 1"),
        ("-0.1:0.5", "0 <= LO <= HI <= 1"),
        ("0:1.5", "0 <= LO <= HI <= 1"),
        ("nan:1", "0 <= LO <= HI <= 1"),
    ],
)
def test_bad_style_times_are_one_line_user_errors(spec, words):
    with pytest.raises(UserError, match=words) as e:
        parse_style_times(spec)
    assert "\n" not in str(e.value)


def test_reference_latents_cover_the_size_without_stretching(tmp_path):
    path = tmp_path / "stripes.png"
    stripes().save(path)
    arr = np.asarray(stripes())
    lat = style_reference_latents([stripes(), arr, path], PixelAE(), (16, 16))
    assert lat.shape == (1, 3, 3, 16, 16) and lat.dtype == torch.float32
    assert torch.equal(lat[0, 0], lat[0, 1]) and torch.equal(lat[0, 0], lat[0, 2])
    # 64x32 scaled to 32x16 and center-cropped to 16x16: green spans columns ~3..13 (a
    # stretch to 16x16 would make columns 3 and 12 red and blue), red and blue the edges
    assert lat.min() >= -1 and lat.max() <= 1
    rgb = lat[0, 0].mean(dim=1)  # [3, 16] column means
    assert (rgb[:, [3, 12]].argmax(0) == 1).all()
    assert rgb[:, 0].argmax() == 0 and rgb[:, 15].argmax() == 2
    assert style_reference_latents([path], PixelAE(2), (16, 8)).shape == (1, 1, 12, 4, 8)


def test_unreadable_reference_images_are_one_line_user_errors(tmp_path):
    good = tmp_path / "good.png"
    stripes().save(good)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:60])
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    for bad in (truncated, text, tmp_path / "missing.png"):
        with pytest.raises(UserError, match="cannot read the image") as e:
            style_reference_latents([bad], PixelAE(), (16, 16))
        assert str(bad) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="uint8"):
        style_reference_latents([np.zeros((8, 8, 3))], PixelAE(), (16, 16))


class PromptEncoder:
    """Text states that depend only on the prompt (as a real encoder's do)."""

    def encode(self, prompts):
        out = []
        for p in prompts:
            g = torch.Generator().manual_seed(zlib.crc32(p.encode()))
            out.append(torch.randn(4, 3, 64, generator=g))
        return torch.stack(out), torch.ones(len(prompts), 4, dtype=torch.bool)


@pytest.fixture(scope="module")
def toy():
    model = Krea2DiT.from_config("toy", depth=1).eval()
    randomize(model, seed=0, std=0.05)
    style = StyleModule(StyleConfig.for_dit(model.cfg)).eval()
    randomize(style, seed=1, std=0.1)
    return model, style


def tokens_for(style, strengths):
    lat = style_reference_latents([stripes(), stripes(32, 64)], PixelAE(), (16, 16))
    return style(lat, torch.tensor([strengths]))


def test_generate_follows_the_reference_and_zero_strength_is_exact(toy):
    model, style = toy
    args = (model, PromptEncoder(), PixelAE(), ["a", "b"], 16, 16)
    plain = generate(*args, steps=2, cfg=2.0)
    assert tokens_for(style, [0.0, 0.0]) is None
    assert torch.equal(generate(*args, steps=2, cfg=2.0, style=None), plain)
    styled = generate(*args, steps=2, cfg=2.0, style=tokens_for(style, [1.0, 0.5]))
    assert not torch.allclose(styled, plain, atol=1e-3)


def test_an_image_with_style_does_not_depend_on_its_batch(toy):
    model, style = toy
    args = (model, PromptEncoder(), PixelAE(), ["a", "b", "c"], 16, 16)
    tokens = tokens_for(style, [1.0, 2.0])
    whole = generate(*args, steps=2, cfg=1.0, style=tokens)
    ones = generate(*args, steps=2, cfg=1.0, style=tokens, batch_size=1)
    torch.testing.assert_close(ones, whole, rtol=1e-5, atol=1e-5)


def test_style_conditions_both_halves_of_cfg(toy, monkeypatch):
    model, style = toy
    seen = []
    real = Krea2DiT.forward

    def spy(self, *args, style=None, **kwargs):
        seen.append(style)
        return real(self, *args, style=style, **kwargs)

    monkeypatch.setattr(Krea2DiT, "forward", spy)
    tokens = tokens_for(style, [1.0, 0.5])
    generate(model, PromptEncoder(), PixelAE(), ["a", "b"], 16, 16, steps=1, cfg=3.0, style=tokens)
    (got,) = seen
    assert got.tokens.shape == (4, 8, model.cfg.width)  # [prompts; negatives]
    for row in range(4):
        assert torch.equal(got.tokens[row], tokens.tokens[0])
        assert torch.equal(got.bias[row], tokens.bias[0])


def test_style_times_keep_the_reference_to_their_window(toy):
    model, style = toy
    args = (model, PromptEncoder(), PixelAE(), ["a", "b"], 16, 16)
    tokens = tokens_for(style, [1.0, 0.5])
    plain = generate(*args, steps=4, cfg=2.0)
    styled = generate(*args, steps=4, cfg=2.0, style=tokens)
    # the whole range is every step; t = 0 alone is no Euler step: the exact plain path
    assert torch.equal(generate(*args, steps=4, cfg=2.0, style=tokens, style_times=(0, 1)), styled)
    assert torch.equal(generate(*args, steps=4, cfg=2.0, style=tokens, style_times=(0, 0)), plain)
    late = generate(*args, steps=4, cfg=2.0, style=tokens, style_times=(0.0, 0.6))
    assert not torch.allclose(late, plain, atol=1e-4) and not torch.allclose(
        late, styled, atol=1e-4
    )
    with pytest.raises(UserError, match="0 <= LO <= HI <= 1"):
        generate(*args, steps=1, style=tokens, style_times=(0.9, 0.1))


def test_rows_at_different_times_each_take_their_own_path(toy):
    model, style = toy
    txt, mask = PromptEncoder().encode(["a", "b"])
    tokens = tokens_for(style, [1.0, 1.0]).broadcast(2)
    x = torch.randn(2, model.cfg.latent_channels, 8, 8, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.9, 0.3])
    timed = dit_velocity(model, txt, mask, style=tokens, style_times=(0.0, 0.5))(x, t)
    plain = dit_velocity(model, txt, mask)(x, t)
    styled = dit_velocity(model, txt, mask, style=tokens)(x, t)
    torch.testing.assert_close(timed[0], plain[0])
    torch.testing.assert_close(timed[1], styled[1])
    assert not torch.allclose(plain[1], styled[1], atol=1e-4)


def test_generate_takes_the_tokens_of_one_image(toy):
    model, _ = toy
    two = StyleTokens(torch.zeros(2, 4, model.cfg.width), torch.zeros(2, 4))
    with pytest.raises(UserError, match=r"one image \(\[1, S, D\]\)"):
        generate(model, PromptEncoder(), PixelAE(), ["a", "b"], 16, 16, steps=1, style=two)


# ---- the CLI ----


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A toy DiT, a style module for it (2 slots), one for the tiny DiT, reference images."""
    root = tmp_path_factory.mktemp("style")
    dit = Krea2DiT.from_config("toy", depth=2)
    save_weights(dit, root / "toy.safetensors")
    style = StyleModule(StyleConfig.for_dit(dit.cfg, max_refs=2))
    randomize(style, seed=1, std=0.5)
    save_style_module(style, root / "style.safetensors")
    save_style_module(
        StyleModule(StyleConfig.for_dit(get_config("tiny"))), root / "tiny.safetensors"
    )
    stripes().save(root / "ref.png")
    (root / "broken.png").write_bytes((root / "ref.png").read_bytes()[:60])
    return root


def sample(files, out, *extra):
    args = ["sample", "--weights", str(files / "toy.safetensors"), "--prompt", "a red circle",
            "--size", "32x32", "--steps", "2", "--cfg", "2", "--text-tokens", "16",
            "--device", "cpu", "--out", str(out), *extra]  # fmt: skip
    return runner.invoke(app, args)


def test_sample_with_a_style_reference(files, tmp_path):
    module = ["--style-module", str(files / "style.safetensors")]
    ref = str(files / "ref.png")
    runs = {
        "plain": [],
        "styled": [*module, "--style-ref", f"{ref}:0.7"],
        "zero": [*module, "--style-ref", f"{ref}:0", "--style-ref", f"{ref}:0"],
        "never": [*module, "--style-ref", f"{ref}:0.7", "--style-times", "0:0"],
    }
    for name, extra in runs.items():
        res = sample(files, tmp_path / name, *extra)
        assert res.exit_code == 0, res.output
    png = {n: (tmp_path / n / "000-seed0.png").read_bytes() for n in runs}
    assert png["styled"] != png["plain"]
    assert png["zero"] == png["plain"]  # strength 0: the exact path without references
    assert png["never"] == png["plain"]  # timed out of every step: the same exact path


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--style-ref", "REF"], "--style-ref needs a style module"),
        (["--style-module", "STYLE", "--style-ref", "BROKEN"], "cannot read the image"),
        (["--style-module", "STYLE", "--style-ref", "REF:-1"], "must be a finite number >= 0"),
        (["--style-module", "STYLE", *["--style-ref", "REF"] * 3], "has 2 slots"),
        (
            ["--style-module", "TINY", "--style-ref", "REF"],
            "width 32, latent_channels 4, patch 2 but the DiT",
        ),
        (["--style-module", "REF", "--style-ref", "REF"], "cannot read style module"),
        (
            ["--style-module", "STYLE", "--style-ref", "REF", "--style-times", "0.8:0.2"],
            "0 <= LO <= HI <= 1",
        ),
        (["--style-module", "STYLE", "--style-ref", "REF", "--style-times", "late"], "write LO:HI"),
        (["--style-times", "0:0.8"], "--style-times needs a --style-ref"),
    ],
)
def test_bad_style_input_is_one_error_line(files, tmp_path, extra, words):
    names = {"REF": "ref.png", "BROKEN": "broken.png", "STYLE": "style.safetensors",
             "TINY": "tiny.safetensors"}  # fmt: skip
    for key, name in names.items():
        extra = [a.replace(key, str(files / name)) if a.startswith(key) else a for a in extra]
    res = sample(files, tmp_path / "out", *extra)
    assert isinstance(res.exception, UserError), res.output
    assert words in str(res.exception) and "\n" not in str(res.exception)
    assert not (tmp_path / "out").exists()


def test_the_krea2_command_exits_2_with_one_error_line(files, tmp_path):
    cmd = [KREA2, "dit", "sample", "--weights", str(files / "toy.safetensors"), "--prompt", "x",
           "--style-ref", f"{files / 'ref.png'}:-1", "--out", str(tmp_path / "out")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --style-ref '{files / 'ref.png'}:-1': strength -1 must be a finite number >= 0 "
        "(0 = off, 1 = as trained)"
    ]


def test_a_model_folder_brings_its_style_module(files, tmp_path):
    folder = write_tiny_model_folder(tmp_path / "native", layout="native")
    style = StyleModule(StyleConfig.for_dit(read_dit_config(folder)))
    save_style_module(style, folder / "style.safetensors")
    parts = read_model_folder(folder)
    assert parts.transformer.name == "krea2-tiny.safetensors"  # the style file is no DiT
    assert plan_sample(model=folder).style_module == folder / "style.safetensors"
    other = files / "style.safetensors"
    assert plan_sample(model=folder, style_module=other).style_module == other
    args = ["sample", "--model", str(folder), "--prompt", "x", "--size", "16x16", "--steps", "1",
            "--cfg", "1", "--text-tokens", "16", "--device", "cpu", "--out", str(tmp_path / "o"),
            "--style-ref", str(files / "ref.png")]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "000-seed0.png").exists()
