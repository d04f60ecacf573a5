"""Ablation switches from the report: each is a config field that changes what it should."""

from __future__ import annotations

import torch

from krea2.dit.config import get_config
from krea2.dit.flops import param_count
from krea2.dit.model import Krea2DiT
from krea2.dit.rope import apply_rope, rope_angles
from krea2.dit.testing import make_inputs, randomize


def build(**kw):
    cfg = get_config("tiny", **kw)
    m = Krea2DiT(cfg).eval()
    randomize(m, seed=7)
    return cfg, m


def test_defaults_equal_the_release():
    cfg = get_config("krea2-12b")
    assert (cfg.attn_gate, cfg.kv_heads, cfg.rope_fraction, cfg.timestep_tokens) == (
        True, 12, 1.0, 0,
    )  # fmt: skip


def test_attention_gate_off_drops_the_gate_projection():
    cfg, m = build(attn_gate=False)
    keys = m.state_dict().keys()
    assert not any(k.endswith("attn.gate.weight") for k in keys)
    assert sum(p.numel() for p in m.parameters()) == param_count(cfg)
    img, txt, t, pos, mask = make_inputs(cfg)
    assert torch.isfinite(m(img, txt, t, pos, mask)).all()


def test_kv_heads_sets_the_key_value_width():
    for kv in (1, 2, 4):
        cfg, m = build(kv_heads=kv)
        assert m.blocks[0].attn.wk.weight.shape == (kv * cfg.head_dim, cfg.width)
        img, txt, t, pos, mask = make_inputs(cfg)
        assert torch.isfinite(m(img, txt, t, pos, mask)).all()


def test_gqa_equals_explicitly_repeated_kv_heads():
    """kv_heads=2 equals a 4-KV-head model whose KV heads are copies (j uses j // 2)."""
    cfg, m = build(kv_heads=2)
    full = Krea2DiT(cfg.replace(kv_heads=4)).eval()
    sd = dict(m.state_dict())
    hd = cfg.head_dim
    for k in list(sd):
        if k.endswith(("attn.wk.weight", "attn.wv.weight")) and k.startswith("blocks"):
            sd[k] = sd[k].view(2, hd, -1).repeat_interleave(2, dim=0).reshape(4 * hd, -1)
    full.load_state_dict(sd)
    img, txt, t, pos, mask = make_inputs(cfg)
    with torch.no_grad():
        torch.testing.assert_close(full(img, txt, t, pos, mask), m(img, txt, t, pos, mask))


def test_partial_rope_rotates_only_the_leading_fraction():
    cfg = get_config("toy", rope_fraction=0.5)
    assert cfg.rope_dims == cfg.head_dim // 2
    pos = torch.randint(0, 9, (1, 5, 3)).float()
    cos, sin = rope_angles(pos, cfg.rope_axes_dims, cfg.rope_theta)
    x = torch.randn(1, 5, 2, cfg.head_dim)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y[..., cfg.rope_dims :], x[..., cfg.rope_dims :], rtol=0, atol=0)
    assert not torch.allclose(y[..., : cfg.rope_dims], x[..., : cfg.rope_dims])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # a rotation


def test_no_rope_makes_the_model_blind_to_image_positions():
    """rope_fraction=0: permuting image tokens permutes the output the same way."""
    cfg, m = build(rope_fraction=0.0, rope_axes=None)
    img, txt, t, pos, mask = make_inputs(cfg)
    perm = torch.randperm(img.shape[1])
    with torch.no_grad():
        a = m(img, txt, t, pos, mask)[:, perm]
        b = m(img[:, perm], txt, t, pos, mask)
    torch.testing.assert_close(a, b)
    _, full = build()
    with torch.no_grad():
        c = full(img, txt, t, pos, mask)[:, perm]
        d = full(img[:, perm], txt, t, pos, mask)
    assert not torch.allclose(c, d, atol=1e-4)


def test_timestep_tokens_replace_all_modulation():
    cfg, m = build(timestep_tokens=4)
    keys = set(m.state_dict())
    assert not any(".mod.lin" in k or k.startswith(("tproj.", "last.modulation")) for k in keys)
    assert m.ttok.weight.shape == (4 * cfg.width, cfg.width)
    assert sum(p.numel() for p in m.parameters()) == param_count(cfg)
    img, txt, t, pos, mask = make_inputs(cfg)
    with torch.no_grad():
        a = m(img, txt, t, pos, mask)
        b = m(img, txt, 1 - t, pos, mask)
    assert a.shape == img.shape and not torch.allclose(a, b)  # time still conditions
