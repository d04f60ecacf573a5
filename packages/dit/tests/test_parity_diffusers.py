"""Our forward equals diffusers' Krea2Transformer2DModel with the same random weights."""

from __future__ import annotations

import pytest
import torch
from diffusers import Krea2Transformer2DModel

from krea2.dit.config import get_config
from krea2.dit.diffusers_config import to_diffusers_config
from krea2.dit.keymap import diffusers_to_krea
from krea2.dit.model import Krea2DiT
from krea2.dit.testing import make_inputs, randomize


def pair(cfg, seed=0):
    """(ours, diffusers) with identical random weights."""
    d = {k: v for k, v in to_diffusers_config(cfg).items() if not k.startswith("_")}
    ref = Krea2Transformer2DModel(**d).eval()
    randomize(ref, seed)
    ours = Krea2DiT(cfg).eval()
    ours.load_state_dict(diffusers_to_krea(ref.state_dict()), strict=True)
    return ours, ref


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


CASES = {
    "tiny-masked-nonsquare-b2": (get_config("tiny"), dict(batch=2, grid=(3, 5), pad=(0, 3))),
    "tiny-b3-all-padded-rows": (get_config("tiny"), dict(batch=3, grid=(4, 2), pad=(1, 4, 2))),
    "gqa-1kv-deeper": (
        get_config("tiny", kv_heads=1, depth=3, layerwise_blocks=2, refiner_blocks=2),
        dict(batch=2, grid=(2, 6), text_len=9, pad=(5, 0)),
    ),
    "toy-like-formula-axes": (
        get_config("toy", depth=2, latent_channels=4, patch=2),
        dict(batch=2, grid=(4, 3), text_len=6, pad=(2, 0)),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_diffusers(case):
    cfg, kw = CASES[case]
    ours, ref = pair(cfg)
    img, txt, t, pos, mask = make_inputs(cfg, **kw)
    with torch.no_grad():
        want = ref(img, txt, t, pos, encoder_attention_mask=mask, return_dict=False)[0]
        got = ours(img, txt, t, pos, mask)
    assert got.shape == want.shape == img.shape
    assert rel_err(got, want) <= 1e-5


def test_batched_positions_equal_shared_positions(tiny_cfg):
    ours, _ = pair(tiny_cfg)
    img, txt, t, pos, mask = make_inputs(tiny_cfg)
    with torch.no_grad():
        a = ours(img, txt, t, pos, mask)
        b = ours(img, txt, t, pos.expand(2, -1, -1), mask)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_padded_text_tokens_do_not_change_output(tiny_cfg):
    """Values at masked text positions are ignored: scrambling them leaves the output alone."""
    ours, _ = pair(tiny_cfg)
    img, txt, t, pos, mask = make_inputs(tiny_cfg, pad=(3, 3))
    scrambled = txt.clone()
    scrambled[~mask] = torch.randn_like(scrambled[~mask]) * 10
    with torch.no_grad():
        torch.testing.assert_close(ours(img, txt, t, pos, mask), ours(img, scrambled, t, pos, mask))


def test_no_mask_equals_all_true_mask(tiny_cfg):
    ours, ref = pair(tiny_cfg)
    img, txt, t, pos, _ = make_inputs(tiny_cfg)
    with torch.no_grad():
        a = ours(img, txt, t, pos, None)
        b = ours(img, txt, t, pos, torch.ones(txt.shape[:2], dtype=torch.bool))
        want = ref(img, txt, t, pos, return_dict=False)[0]
    torch.testing.assert_close(a, b)
    assert rel_err(a, want) <= 1e-5


def test_gradients_match_diffusers(tiny_cfg):
    ours, ref = pair(tiny_cfg)
    img, txt, t, pos, mask = make_inputs(tiny_cfg)
    ours(img, txt, t, pos, mask).square().mean().backward()
    ref(img, txt, t, pos, encoder_attention_mask=mask, return_dict=False)[
        0
    ].square().mean().backward()
    gref = diffusers_to_krea({k: p.grad for k, p in ref.named_parameters()})
    for k, p in ours.named_parameters():
        assert rel_err(p.grad, gref[k]) <= 1e-4, k


def test_packing_text_drops_padding_without_changing_the_output():
    cfg = get_config("tiny", timestep_tokens=0)
    ours, ref = pair(cfg)
    img, txt, t, pos, mask = make_inputs(cfg, batch=3, text_len=9, pad=(0, 4, 6))
    with torch.no_grad():
        want = ref(img, txt, t, pos, encoder_attention_mask=mask, return_dict=False)[0]
        got = ours(img, txt, t, pos, mask, pack_text=True)
    assert rel_err(got, want) <= 1e-5


def test_packed_text_keeps_valid_tokens_in_order():
    from krea2.dit.model import pack_valid_text

    txt = torch.arange(2 * 5, dtype=torch.float32).view(2, 5, 1, 1)
    mask = torch.tensor([[1, 0, 1, 0, 1], [0, 0, 1, 1, 0]], dtype=torch.bool)
    pos = torch.arange(7 * 3, dtype=torch.float32).view(7, 3)
    p_txt, p_mask, p_pos = pack_valid_text(txt, mask, pos)
    assert p_txt.flatten(1).tolist() == [[0, 2, 4], [7, 8, 5]]
    assert p_mask.tolist() == [[True, True, True], [True, True, False]]
    assert p_pos.shape == (2, 5, 3) and torch.equal(p_pos[:, 3:], pos[None, 5:].expand(2, -1, -1))
