"""generate(): batches, time-shift rules, x0 predictions, opt-in progress; whole PNGs only."""

from __future__ import annotations

import zlib

import pytest
import torch
from PIL import Image

from krea2.dit import flow
from krea2.dit.generation import generate, save_pngs
from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import PixelAE
from krea2.dit.sampler import euler_sample, from_x0, seeded_noise
from krea2.dit.testing import randomize


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
    return model


def test_an_image_does_not_depend_on_its_batch(toy):
    args = (toy, PromptEncoder(), PixelAE(), ["a", "b", "c"], 16, 16)
    whole = generate(*args, steps=2, cfg=1.0, seed=3)
    ones = generate(*args, steps=2, cfg=1.0, seed=3, batch_size=2)
    torch.testing.assert_close(ones, whole, rtol=1e-5, atol=1e-5)
    assert whole.shape == (3, 3, 16, 16) and whole.device.type == "cpu"


def test_a_time_shift_rule_equals_its_mu(toy):
    args = (toy, PromptEncoder(), PixelAE(), ["a"], 16, 16)
    rule = flow.TimeShift(x1=1, y1=0.2, x2=100, y2=1.2)  # 4x4 = 16 tokens at patch 4
    got = generate(*args, steps=3, cfg=0.0, mu=rule)
    want = generate(*args, steps=3, cfg=0.0, mu=rule.mu(16))
    assert torch.equal(got, want) and not torch.equal(got, generate(*args, steps=3, cfg=0.0))


def test_an_exact_x0_predictor_lands_on_its_data():
    data = torch.randn(2, 3, 8, 8)
    noise = seeded_noise([0, 1], (3, 8, 8))
    got = euler_sample(from_x0(lambda x, t: data), noise, flow.sampling_times(4, 0.5))
    torch.testing.assert_close(got, data, rtol=1e-5, atol=1e-5)


def test_x0_prediction_turns_the_dit_output_into_a_velocity(toy):
    args = (toy, PromptEncoder(), PixelAE(), ["a"], 16, 16)
    assert not torch.equal(
        generate(*args, steps=2, cfg=0.0, prediction="x0"), generate(*args, steps=2, cfg=0.0)
    )


def test_progress_is_silent_unless_asked(toy, capsys, monkeypatch):
    monkeypatch.setenv("KREA2_PROGRESS", "plain")
    args = (toy, PromptEncoder(), PixelAE(), ["a", "b", "c"], 16, 16)
    generate(*args, steps=2, cfg=0.0, batch_size=2)
    assert capsys.readouterr().err == ""
    generate(*args, steps=2, cfg=0.0, batch_size=2, progress=True)
    assert "sample 16x16: 4/4 step (100%)" in capsys.readouterr().err  # 2 steps x 2 batches


def test_an_interrupted_save_leaves_no_partial_png(tmp_path, monkeypatch):
    images = torch.zeros(2, 3, 8, 8)
    written = []

    def save_then_interrupt(self, fp, *args, **kwargs):
        with open(fp, "wb") as f:
            f.write(b"\x89PNG partial")
        written.append(fp)
        if len(written) == 2:
            raise KeyboardInterrupt

    real_save = Image.Image.save
    monkeypatch.setattr(Image.Image, "save", save_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        save_pngs(images, tmp_path, [0, 1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000-seed0.png"]
    monkeypatch.setattr(Image.Image, "save", real_save)
    assert [p.name for p in save_pngs(images, tmp_path, [0, 1])] == [
        "000-seed0.png",
        "001-seed1.png",
    ]
    assert Image.open(tmp_path / "001-seed1.png").size == (8, 8)


def test_seeds_give_each_image_its_own_seed(toy):
    from krea2.infra.errors import UserError

    args = (toy, PromptEncoder(), PixelAE(), ["a", "b"], 16, 16)
    assert torch.equal(
        generate(*args, steps=2, cfg=0.0, seed=4), generate(*args, steps=2, cfg=0.0, seeds=[4, 5])
    )
    mixed = generate(*args, steps=2, cfg=0.0, seeds=[9, 3])
    alone = generate(toy, PromptEncoder(), PixelAE(), ["b"], 16, 16, steps=2, cfg=0.0, seed=3)
    torch.testing.assert_close(mixed[1], alone[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="1 seeds for 2 prompts"):
        generate(*args, steps=2, cfg=0.0, seeds=[1])
