"""Text encoder (tiny Qwen3-VL, code-built tokenizer), embedding cache, the two VAEs."""

from __future__ import annotations

import pytest
import torch
from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

from krea2.dit.model import Krea2DiT
from krea2.dit.text import EmbeddingCache, TextEncoder
from krea2.dit.tokenizer import build_tokenizer
from krea2.dit.vae import Flux2VAE, QwenImageVAE
from krea2.infra.errors import UserError

CORPUS = ["a red circle", "a blue square", "a green star", "two shapes"]  # our own words


@pytest.fixture(scope="module")
def enc() -> TextEncoder:
    return TextEncoder.tiny(text_dim=64, taps=3, max_length=24, corpus=CORPUS)


def test_tokenizer_learns_the_callers_vocabulary():
    plain, shapes = build_tokenizer(), build_tokenizer(CORPUS * 4)
    assert len(shapes("a red circle").input_ids) == 3  # one token per word
    assert len(plain("a red circle").input_ids) > 3  # no world's words are built in
    assert len(plain("<|im_start|>system").input_ids) == 2  # the template always is


def test_tokenizer_is_deterministic_and_lossless():
    a, b = build_tokenizer(CORPUS), build_tokenizer(CORPUS)
    text = "a red circle with the word 'HI' — ünïcödé"
    assert a(text).input_ids == b(text).input_ids
    assert a.decode(a(text).input_ids) == text
    assert a.pad_token == "<|endoftext|>"
    assert len(a("<|im_start|>").input_ids) == 1


def test_layout_prompt_then_padding_then_suffix(enc):
    states, mask = enc.encode(["a red circle", ""])
    assert states.shape == (2, 24, 3, 64) and mask.shape == (2, 24)
    n_prompt = len(enc.tokenizer("a red circle").input_ids)
    s = enc.suffix_len
    want = [True] * n_prompt + [False] * (24 - n_prompt - s) + [True] * s
    assert mask[0].tolist() == want
    assert mask[1].tolist() == [False] * (24 - s) + [True] * s  # empty prompt: suffix only


def test_long_prompts_truncate_and_keep_the_suffix(enc):
    _, mask = enc.encode(["a blue square " * 40])
    assert mask.shape == (1, 24) and bool(mask.all())


def test_padding_consumes_no_position(enc):
    """Valid tokens' states do not depend on how much padding the layout holds."""
    longer = TextEncoder(enc.model, enc.tokenizer, enc.taps, max_length=40)
    a, ma = enc.encode(["a green star"])
    b, mb = longer.encode(["a green star"])
    torch.testing.assert_close(a[ma], b[mb], atol=1e-5, rtol=1e-5)


def test_taps_are_the_selected_hidden_states(enc):
    ids, mask = enc.tokenize(["two shapes"])
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[None].expand(3, -1, -1)
    with torch.no_grad():
        hs = enc.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True
        ).hidden_states
    states, _ = enc.encode(["two shapes"])
    for j, i in enumerate(enc.taps):
        torch.testing.assert_close(states[0, :, j], hs[i][0, enc.prefix_len :])


def test_text_stack_feeds_the_toy_dit(enc):
    states, mask = enc.encode(["a red circle", "a blue square"])
    model = Krea2DiT.from_config("toy")
    v = model.velocity(torch.randn(2, 3, 32, 32), states, torch.rand(2), mask)
    assert v.shape == (2, 3, 32, 32) and torch.isfinite(v).all()


def test_bad_taps_are_rejected(enc):
    with pytest.raises(UserError, match="outside hidden_states"):
        TextEncoder(enc.model, enc.tokenizer, taps=(1, 9))


def test_embedding_cache_hits_and_persists(enc, tmp_path):
    cache = EmbeddingCache(enc, root=tmp_path)
    a, ma = cache.encode(["a red circle", "a blue square"])
    b, mb = cache.encode(["a blue square", "a red circle", "a red circle"])
    assert (cache.misses, cache.hits) == (2, 3)
    torch.testing.assert_close(b[1], a[0])
    assert torch.equal(mb[1], ma[0])
    fresh = EmbeddingCache(enc, root=tmp_path)  # a new process would see the disk entries
    c, mc = fresh.encode(["a red circle"])
    assert fresh.misses == 0
    torch.testing.assert_close(c[0], a[0])
    assert torch.equal(mc[0], ma[0])
    direct, _ = enc.encode(["a red circle"])
    torch.testing.assert_close(direct[0], a[0])


@pytest.mark.parametrize("cls", [QwenImageVAE, Flux2VAE])
def test_vae_interface_shapes_and_normalization(cls):
    ae = cls.tiny()
    x = torch.rand(2, 3, 16, 24) * 2 - 1
    z = ae.encode(x)
    f = ae.spatial_factor
    assert z.shape == (2, ae.latent_channels, 16 // f, 24 // f)
    torch.testing.assert_close(ae.denormalize(ae.normalize(z)), z, atol=1e-5, rtol=1e-5)
    y = ae.decode(z)
    assert y.shape == x.shape and y.abs().max() <= 1
    with pytest.raises(UserError, match="not divisible"):
        ae.encode(torch.zeros(1, 3, 18, 24))


def test_qwen_normalization_is_per_channel_mean_std():
    ae = QwenImageVAE.tiny()
    raw = torch.randn(1, 16, 2, 2)
    mean = torch.tensor(ae.vae.config.latents_mean).view(1, -1, 1, 1)
    std = torch.tensor(ae.vae.config.latents_std).view(1, -1, 1, 1)
    torch.testing.assert_close(ae.normalize(raw), (raw - mean) / std)


def test_flux2_normalization_equals_the_flux2_pipeline():
    ae = Flux2VAE.tiny()
    raw = torch.randn(2, 4, 6, 8)
    packed = Flux2Pipeline._patchify_latents(raw)
    mean = ae.vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(ae.vae.bn.running_var.view(1, -1, 1, 1) + ae.vae.config.batch_norm_eps)
    want = (packed - mean) / std
    got = Flux2Pipeline._patchify_latents(ae.normalize(raw))
    torch.testing.assert_close(got, want)


def test_text_encoder_loads_from_a_local_folder(enc, tmp_path):
    enc.model.save_pretrained(tmp_path)
    enc.tokenizer.save_pretrained(tmp_path)
    loaded = TextEncoder.from_pretrained(
        tmp_path, taps=enc.taps, max_length=24, dtype=torch.float32
    )
    a, ma = enc.encode(["a red circle"])
    b, mb = loaded.encode(["a red circle"])
    assert torch.equal(ma, mb)
    torch.testing.assert_close(a, b)
    assert loaded.fingerprint() == enc.fingerprint()
    with pytest.raises(UserError, match=r"has no config\.json"):
        TextEncoder.from_pretrained(tmp_path / "missing")


@pytest.mark.parametrize("cls", [QwenImageVAE, Flux2VAE])
def test_vae_loads_from_a_local_folder(cls, tmp_path):
    ae = cls.tiny()
    ae.vae.save_pretrained(tmp_path / "vae")
    loaded = cls.from_pretrained(tmp_path, dtype=torch.float32)  # finds the vae/ subfolder
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    torch.testing.assert_close(loaded.encode(x), ae.encode(x))


def test_a_text_encoder_folder_without_a_tokenizer_is_refused(enc, tmp_path):
    enc.model.save_pretrained(tmp_path / "text_encoder")  # the diffusers layout, no tokenizer/
    with pytest.raises(UserError, match=r"no tokenizer for the text encoder .*text_encoder"):
        TextEncoder.from_pretrained(tmp_path / "text_encoder", taps=enc.taps, max_length=24)


def test_an_empty_tokenizer_is_refused(enc, tmp_path):
    from transformers import AutoTokenizer

    enc.model.save_pretrained(tmp_path)
    empty = AutoTokenizer.from_pretrained(tmp_path)  # what transformers builds without files
    with pytest.raises(UserError, match="tokenizer is empty"):
        TextEncoder(enc.model, empty, enc.taps, max_length=24)


def test_the_diffusers_layout_finds_the_sibling_tokenizer(enc, tmp_path):
    enc.model.save_pretrained(tmp_path / "text_encoder")
    enc.tokenizer.save_pretrained(tmp_path / "tokenizer")
    want = enc.encode(["a red circle", "two shapes"])
    for path in (tmp_path / "text_encoder", tmp_path):  # the model folder or the whole folder
        loaded = TextEncoder.from_pretrained(path, enc.taps, 24, dtype=torch.float32)
        got = loaded.encode(["a red circle", "two shapes"])
        assert torch.equal(got[1], want[1])
        torch.testing.assert_close(got[0], want[0])
