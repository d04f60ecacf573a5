"""Weight-only quantized sampling (krea2.dit.weight_quant, torchao, CPU): int8 block Linears
take under 0.4 of fp32's bytes and keep the velocity and the images close; float8 and
unknown modes are refused before any weight loads; LoRA adapters still apply on top."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from krea2.dit.lora_files import LoraAdapter, applied
from krea2.dit.served_model import ServedModel, Shape
from krea2.dit.weight_quant import check_weight_quant, quantize_block_linears, stored_bytes
from krea2.infra.errors import UserError


@pytest.fixture(scope="module")
def pair(serving_folder):
    plain = ServedModel.load(serving_folder, text_tokens=16)
    quant = ServedModel.load(serving_folder, text_tokens=16, quant="int8")
    return plain, quant


def test_int8_blocks_take_under_0_4_of_the_bytes_and_keep_the_velocity(pair):
    plain, quant = pair
    wq = quant.net.blocks[0].attn.wq.weight
    assert "Int8" in type(wq).__name__ and not wq.requires_grad
    ratio = stored_bytes(quant.net, "blocks.") / stored_bytes(plain.net, "blocks.")
    assert ratio < 0.4, ratio  # int8 weights + fp32 scales against fp32
    assert stored_bytes(quant.net, "first.") == stored_bytes(plain.net, "first.")  # untouched
    g = torch.Generator().manual_seed(0)
    layer_p, layer_q = plain.net.blocks[0].attn.wq, quant.net.blocks[0].attn.wq
    x = torch.randn(4, layer_p.weight.shape[1], generator=g)
    with torch.no_grad():
        ref, out = layer_p(x), layer_q(x)
    err = (out - ref).norm() / ref.norm()
    assert 0 < err < 0.02, err  # int8 rounding, not another layer


def test_int8_images_stay_close_to_full_precision(pair):
    plain, quant = pair
    shape = Shape(32, 32, steps=4, cfg=2.0)
    prompts, seeds = ["a red circle", "a blue square"], [0, 1]
    a = plain.render(shape, prompts, seeds).astype(int)
    b = quant.render(shape, prompts, seeds).astype(int)
    assert np.abs(a - b).mean() < 4.0, np.abs(a - b).mean()  # of 255 levels


def test_a_lora_applies_on_top_of_int8_weights(pair):
    _, quant = pair
    layer = quant.net.blocks[0].attn.wq
    out_dim, in_dim = layer.weight.shape
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, in_dim, generator=g), torch.randn(out_dim, 2, generator=g)
    adapter = LoraAdapter("x", {"blocks.0.attn.wq": (a, b, 1.0)})
    x = torch.randn(3, in_dim, generator=g)
    with torch.no_grad():
        base = layer(x)
        with applied(quant.net, [(adapter, 0.5)]):
            hooked = layer(x)
    torch.testing.assert_close(hooked - base, 0.5 * (x @ a.T) @ b.T, rtol=1e-4, atol=1e-4)


def test_float8_on_cpu_and_unknown_modes_are_refused_before_loading(serving_folder):
    with pytest.raises(UserError, match=r"float8.*CUDA GPU.*8\.9.*int8"):
        check_weight_quant("float8", "cpu")
    with pytest.raises(UserError, match="choose one of none, int8, float8"):
        check_weight_quant("int4", "cpu")
    with pytest.raises(UserError, match="float8"):
        ServedModel.load(serving_folder, text_tokens=16, quant="float8")
    net = torch.nn.Sequential(torch.nn.Linear(4, 4))  # no blocks: nothing to quantize
    with pytest.raises(UserError, match="no block Linear"):
        quantize_block_linears(net, "int8", "cpu")
    assert quantize_block_linears(net, "none", "cpu") == []
