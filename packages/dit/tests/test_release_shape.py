"""krea2-12b on the meta device: exact parameter count and the released keys and shapes."""

from __future__ import annotations

import torch

from krea2.dit.config import get_config
from krea2.dit.model import Krea2DiT


def released_keys() -> dict[str, tuple[int, ...]]:
    """The released checkpoint's 430 keys, written out from the spec (architecture §1.2)."""
    d, txt, hid, thid = 6144, 2560, 16384, 6912
    keys = {
        "first.weight": (d, 64), "first.bias": (d,),
        "tmlp.0.weight": (d, 256), "tmlp.0.bias": (d,),
        "tmlp.2.weight": (d, d), "tmlp.2.bias": (d,),
        "tproj.1.weight": (6 * d, d), "tproj.1.bias": (6 * d,),
        "txtfusion.projector.weight": (1, 12),
        "txtmlp.0.scale": (txt,),
        "txtmlp.1.weight": (d, txt), "txtmlp.1.bias": (d,),
        "txtmlp.3.weight": (d, d), "txtmlp.3.bias": (d,),
        "last.norm.scale": (d,), "last.linear.weight": (64, d), "last.linear.bias": (64,),
        "last.modulation.lin": (2, d),
    }  # fmt: skip

    def block(prefix: str, dim: int, kv: int, hidden: int) -> None:
        keys[f"{prefix}.prenorm.scale"] = (dim,)
        keys[f"{prefix}.postnorm.scale"] = (dim,)
        keys[f"{prefix}.attn.wq.weight"] = (dim, dim)
        keys[f"{prefix}.attn.wk.weight"] = (kv, dim)
        keys[f"{prefix}.attn.wv.weight"] = (kv, dim)
        keys[f"{prefix}.attn.gate.weight"] = (dim, dim)
        keys[f"{prefix}.attn.wo.weight"] = (dim, dim)
        keys[f"{prefix}.attn.qknorm.qnorm.scale"] = (128,)
        keys[f"{prefix}.attn.qknorm.knorm.scale"] = (128,)
        keys[f"{prefix}.mlp.gate.weight"] = (hidden, dim)
        keys[f"{prefix}.mlp.up.weight"] = (hidden, dim)
        keys[f"{prefix}.mlp.down.weight"] = (dim, hidden)

    for kind in ("layerwise_blocks", "refiner_blocks"):
        for i in range(2):
            block(f"txtfusion.{kind}.{i}", txt, txt, thid)
    for i in range(28):
        block(f"blocks.{i}", d, 1536, hid)
        keys[f"blocks.{i}.mod.lin"] = (6 * d,)
    return keys


def test_krea2_12b_has_released_parameter_count_and_keys():
    with torch.device("meta"):
        model = Krea2DiT.from_config("krea2-12b")
    sd = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == 12_820_073_036
    assert len(sd) == 430
    want = released_keys()
    assert {k: tuple(v.shape) for k, v in sd.items()} == want


def test_release_derived_shapes():
    cfg = get_config("krea2-12b")
    assert cfg.head_dim == 128
    assert cfg.rope_axes_dims == (32, 48, 48)
    assert cfg.mlp_hidden_size == 16384
    assert cfg.text_mlp_hidden_size == 6912
    assert cfg.in_channels == 64


def test_norms_are_fp32_and_tables_zero_at_init():
    model = Krea2DiT.from_config("tiny")
    assert model.blocks[0].prenorm.scale.dtype == torch.float32
    assert torch.count_nonzero(model.blocks[0].mod.lin) == 0
    assert torch.count_nonzero(model.last.modulation.lin) == 0


def test_forward_traces_without_graph_breaks():
    """torch.compile-friendly: dynamo captures the whole forward as one graph."""
    from krea2.dit.testing import make_inputs

    cfg = get_config("tiny")
    model = Krea2DiT(cfg)
    img, txt, t, pos, mask = make_inputs(cfg)
    explained = torch._dynamo.explain(model)(img, txt, t, pos, mask)
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1


def test_meta_build_then_init_weights_gives_a_working_model():
    from krea2.dit.testing import make_inputs

    cfg = get_config("tiny")
    with torch.device("meta"):
        model = Krea2DiT(cfg)
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.count_nonzero(model.blocks[0].mod.lin) == 0
    assert torch.count_nonzero(model.blocks[1].prenorm.scale) == 0
    assert model.first.weight.std() > 0
    img, txt, t, pos, mask = make_inputs(cfg)
    assert torch.isfinite(model(img, txt, t, pos, mask)).all()
