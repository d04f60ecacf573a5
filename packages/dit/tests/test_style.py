"""Style references in the DiT: the module's tokens, the log-strength bias, s = 0 exact."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import krea2.dit.attention as attention
from krea2.dit.blocks import SingleStreamBlock
from krea2.dit.config import get_config
from krea2.dit.flops import extra_token_flops
from krea2.dit.model import Krea2DiT
from krea2.dit.style_module import (
    StyleConfig,
    StyleModule,
    StyleTokens,
    load_style_module,
    save_style_module,
    style_module_flops,
    style_module_params,
)
from krea2.dit.testing import count_flops, make_inputs, randomize
from krea2.dit.weights import save_weights
from krea2.infra.errors import UserError

M = 4  # tokens per reference (the default)


@pytest.fixture(scope="module")
def dit():
    model = Krea2DiT(get_config("tiny")).eval()
    randomize(model, seed=0, std=0.1)
    return model


@pytest.fixture(scope="module")
def style():
    module = StyleModule(StyleConfig.for_dit(get_config("tiny"))).eval()
    randomize(module, seed=1, std=0.1)
    return module


def refs(batch=2, count=2, seed=2):
    """Reference latents [B, R, C=4, 6, 10] for the tiny config (patch 2)."""
    return torch.randn(batch, count, 4, 6, 10, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def run(dit, tokens=None, pack_text=False):
    img, txt, t, pos, mask = make_inputs(dit.cfg)
    if tokens is None:
        return dit(img, txt, t, pos, mask, pack_text=pack_text)
    return dit(img, txt, t, pos, mask, pack_text=pack_text, style=tokens)


def strengths(*row):
    return torch.tensor([list(row)] * 2)


def test_style_none_is_the_path_without_style(dit):
    img, txt, t, pos, mask = make_inputs(dit.cfg)
    with torch.no_grad():
        assert torch.equal(dit(img, txt, t, pos, mask, style=None), dit(img, txt, t, pos, mask))
        lat = torch.randn(2, 4, 6, 10)
        v = dit.velocity(lat, txt, t, mask)
        assert torch.equal(dit.velocity(lat, txt, t, mask, style=None), v)


def test_all_strengths_zero_give_no_tokens(style):
    assert style(refs(), torch.zeros(2, 2)) is None


def test_tokens_and_bias_follow_references_and_strengths(style):
    out = style(refs(), torch.tensor([[1.0, 0.5], [0.0, 2.0]]))
    assert out.tokens.shape == (2, 2 * M, 32) and out.bias.dtype == torch.float32
    want = torch.tensor([[0.0] * M + [-0.6931] * M, [float("-inf")] * M + [0.6931] * M])
    torch.testing.assert_close(out.bias, want, atol=1e-4, rtol=0)


def test_a_dropped_reference_leaves_the_others_in_their_slots(style):
    both = style(refs(), strengths(1.0, 1.0))
    second = style(refs(), strengths(0.0, 1.0))
    assert second.tokens.shape[1] == M
    torch.testing.assert_close(second.tokens, both.tokens[:, M:])
    # the same image in another slot gives other tokens (slot embeddings)
    same = refs(count=1).expand(-1, 2, -1, -1, -1)
    twice = style(same, strengths(1.0, 1.0)).tokens
    assert not torch.allclose(twice[:, :M], twice[:, M:])


def test_attention_mass_on_a_reference_grows_with_its_strength(dit, style, monkeypatch):
    masses = []
    real = attention.sdpa_gqa

    def recording(q, k, v, mask, backend="auto"):
        if mask is not None and mask.is_floating_point() and not masses[-1]:
            groups = q.shape[1] // k.shape[1]
            kk = k.repeat_interleave(groups, dim=1)
            logits = q @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask
            weights = logits.softmax(-1)  # [B, H, L, L]
            start = 7 + M  # text length 7, then reference 0, then reference 1
            masses[-1].append(float(weights[..., -15:, start : start + M].sum(-1).mean()))
        return real(q, k, v, mask, backend)

    monkeypatch.setattr(attention, "sdpa_gqa", recording)
    for s in (0.1, 0.5, 1.0, 2.0, 8.0):
        masses.append([])
        run(dit, style(refs(), strengths(1.0, s)))
    first_block = [m[0] for m in masses]
    assert first_block == sorted(first_block) and first_block[0] < first_block[-1] / 10


def test_a_tiny_strength_tends_to_the_output_without_that_reference(dit, style):
    without = run(dit, style(refs(), strengths(1.0, 0.0)))
    tiny = run(dit, style(refs(), strengths(1.0, 1e-6)))
    assert not torch.equal(tiny, without)
    torch.testing.assert_close(tiny, without, atol=1e-5, rtol=1e-5)
    one = refs(count=1)
    torch.testing.assert_close(run(dit, style(one, strengths(1e-6))), run(dit), atol=1e-5, rtol=0)
    assert not torch.allclose(run(dit, style(one, strengths(1.0))), run(dit), atol=1e-3)


def test_a_row_with_strength_zero_matches_that_row_without_the_reference(dit, style):
    mixed = run(dit, style(refs(), torch.tensor([[1.0, 0.0], [1.0, 1.0]])))
    alone = run(dit, style(refs(), strengths(1.0, 0.0)))
    torch.testing.assert_close(mixed[0], alone[0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(mixed[1], alone[1], atol=1e-3)


def test_packed_text_gives_the_same_output_with_style(dit, style):
    tokens = style(refs(), strengths(1.0, 0.5))
    torch.testing.assert_close(run(dit, tokens, pack_text=True), run(dit, tokens))


def test_the_last_block_computes_image_rows_only(dit, style, monkeypatch):
    starts = []
    real = SingleStreamBlock.forward

    def spy(self, x, tvec, rope, mask=None, out_start=0):
        starts.append(out_start)
        return real(self, x, tvec, rope, mask, out_start)

    monkeypatch.setattr(SingleStreamBlock, "forward", spy)
    out = run(dit, style(refs(), strengths(1.0, 1.0)))
    assert starts == [0, 7 + 2 * M] and out.shape == (2, 15, dit.cfg.in_channels)


def test_time_tokens_and_bf16_take_style(style):
    cfg = get_config("tiny", timestep_tokens=2)
    model = Krea2DiT(cfg).eval()
    randomize(model, seed=0, std=0.1)
    tokens = style(refs(), strengths(1.0, 0.5))
    img, txt, t, pos, mask = make_inputs(cfg)
    with torch.no_grad():
        ref = model(img, txt, t, pos, mask, style=tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = model(img, txt, t, pos, mask, style=tokens)
        half = model.to(torch.bfloat16)(img.bfloat16(), txt.bfloat16(), t, pos, mask, style=tokens)
    assert ref.shape == (2, 15, cfg.in_channels)
    for got in (auto, half):
        assert (got.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_sdpa_takes_an_additive_mask_with_gqa_and_bf16():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8, generator=g), *torch.randn(2, 2, 2, 6, 8, generator=g)
    mask = torch.zeros(2, 1, 1, 6)
    mask[0, ..., 1] = float("-inf")
    mask[1, ..., 2] = -1.5
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask
    )
    torch.testing.assert_close(attention.sdpa_gqa(q, k, v, mask), want)
    half = attention.sdpa_gqa(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask.bfloat16())
    torch.testing.assert_close(half.float(), want, atol=0.05, rtol=0.05)


def test_gradients_reach_the_module_through_a_frozen_dit(style):
    frozen = Krea2DiT(get_config("tiny")).requires_grad_(False)
    randomize(frozen, seed=0, std=0.1)
    frozen.requires_grad_(False)
    module = StyleModule(style.cfg)
    img, txt, t, pos, mask = make_inputs(frozen.cfg)
    out = frozen(img, txt, t, pos, mask, style=module(refs(), strengths(1.0, 1.0)))
    out.square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    assert all(p.grad is None for p in frozen.parameters())


def test_keep_all_gives_every_parameter_a_gradient_at_strength_zero(style):
    # What FSDP/DDP need: a rank whose rows all have strength 0 still reduces gradients.
    frozen = Krea2DiT(get_config("tiny")).requires_grad_(False)
    module = StyleModule(style.cfg)
    tokens = module(refs(), torch.zeros(2, 2), keep_all=True)
    assert tokens.tokens.shape == (2, 2 * M, 32) and bool((tokens.bias == -float("inf")).all())
    img, txt, t, pos, mask = make_inputs(frozen.cfg)
    out = frozen(img, txt, t, pos, mask, style=tokens)
    torch.testing.assert_close(out, frozen(img, txt, t, pos, mask), atol=1e-5, rtol=1e-5)
    out.square().mean().backward()
    assert all(p.grad is not None and not p.grad.isnan().any() for p in module.parameters())


def test_bad_references_are_user_errors(style):
    with pytest.raises(UserError, match="4 slots"):
        style(refs(count=5), torch.ones(2, 5))
    with pytest.raises(UserError, match=">= 0"):
        style(refs(), strengths(1.0, -0.5))
    with pytest.raises(UserError, match="finite"):
        style(refs(), strengths(1.0, float("nan")))
    with pytest.raises(UserError, match="C=4"):
        style(torch.zeros(2, 1, 3, 6, 10), torch.ones(2, 1))
    with pytest.raises(UserError, match="patch=2"):
        style(torch.zeros(2, 1, 4, 5, 10), torch.ones(2, 1))


def test_style_tokens_of_another_shape_are_refused(dit):
    img, txt, t, pos, mask = make_inputs(dit.cfg)
    wrong = StyleTokens(torch.zeros(2, 4, 16), torch.zeros(2, 4))
    with pytest.raises(UserError, match="width=32"):
        dit(img, txt, t, pos, mask, style=wrong)


def test_config_names_the_bad_field():
    cfg = StyleConfig.for_dit(get_config("toy"), tokens=8)
    assert (cfg.width, cfg.latent_channels, cfg.patch, cfg.tokens, cfg.model) == (
        128, 3, 4, 8, "toy"
    )  # fmt: skip
    with pytest.raises(UserError, match="heads"):
        StyleConfig.for_dit(get_config("tiny"), heads=3)
    with pytest.raises(UserError, match="max_refs"):
        StyleConfig(width=32, latent_channels=4, patch=2, max_refs=0)
    with pytest.raises(UserError, match="'token'"):
        StyleConfig.for_dit(get_config("tiny"), token=3)


def test_parameter_and_flop_counts_match_torch():
    for name in ("tiny", "toy"):
        module = StyleModule(StyleConfig.for_dit(get_config(name)))
        assert sum(p.numel() for p in module.parameters()) == style_module_params(module.cfg)
    with torch.device("meta"):
        big = StyleModule(StyleConfig.for_dit(get_config("krea2-12b")))
    assert sum(p.numel() for p in big.parameters()) == style_module_params(big.cfg)
    module = StyleModule(StyleConfig.for_dit(get_config("tiny")))
    counted = count_flops(lambda: module(refs(batch=1, count=2), torch.ones(1, 2)))
    assert counted == style_module_flops(module.cfg, ref_tokens=15, refs=2)


def test_extra_token_flops_are_what_the_style_tokens_cost():
    cfg = get_config("tiny")
    model = Krea2DiT(cfg)
    img, txt, t, pos, mask = make_inputs(cfg)
    tokens = StyleTokens(torch.randn(2, 8, cfg.width), torch.zeros(2, 8))
    base = count_flops(lambda: model(img, txt, t, pos, mask))
    more = count_flops(lambda: model(img, txt, t, pos, mask, style=tokens))
    assert more - base == extra_token_flops(cfg, 8, image_tokens=15, text_tokens=7, batch=2)


def test_a_saved_module_loads_with_its_config_and_outputs(style, tmp_path):
    path = save_style_module(style, tmp_path / "style.safetensors")
    loaded = load_style_module(path, get_config("tiny"))
    assert loaded.cfg == style.cfg and not any(tmp_path.glob("*.tmp"))
    a, b = style(refs(), strengths(1.0, 0.5)), loaded(refs(), strengths(1.0, 0.5))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.bias, b.bias)
    assert load_style_module(path, dtype=torch.bfloat16).embed.weight.dtype == torch.bfloat16


def test_a_module_for_another_model_is_refused_naming_both(style, tmp_path):
    path = save_style_module(style, tmp_path / "style.safetensors")
    with pytest.raises(UserError) as e:
        load_style_module(path, get_config("toy"))
    msg = str(e.value)
    assert "made for 'tiny'" in msg and "width 32" in msg and "width 128" in msg
    assert "\n" not in msg


def test_files_that_are_no_style_module_are_refused(tmp_path):
    dit_file = save_weights(Krea2DiT(get_config("tiny")), tmp_path / "dit.safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    bad_config = tmp_path / "bad.safetensors"
    save_file({"x": torch.zeros(1)}, str(bad_config), metadata={"krea2.dit.style_config": "{}"})
    for path, words in [
        (dit_file, "is not a style module"),
        (garbage, "cannot read style module"),
        (bad_config, "bad krea2.dit.style_config"),
        (tmp_path / "missing.safetensors", "does not exist"),
    ]:
        with pytest.raises(UserError, match=words) as e:
            load_style_module(path)
        assert "\n" not in str(e.value)
