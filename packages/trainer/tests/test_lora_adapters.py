"""Two LoRA adapters on one DiT (a stage's own and an objective's, e.g. TDM's fake score):
each switched on alone or both off (the bare base) without touching ``requires_grad``,
gradients reaching only the adapter in use, and the stage's exported adapter leaving the
objective's out."""

from __future__ import annotations

import torch

from krea2.dit.config import get_config
from krea2.dit.model import Krea2DiT
from krea2.dit.testing import make_inputs, randomize
from krea2.trainer.config import LoraConfig
from krea2.trainer.lora import (
    ADAPTER,
    adapter_in_use,
    adapter_tensors,
    apply_lora,
    is_objective_adapter_key,
    is_stage_adapter_key,
    reset_lora,
)


def _dit_with_two_adapters() -> tuple[Krea2DiT, dict[str, torch.Tensor]]:
    """A tiny random DiT with the stage's adapter (rank 4) and a ``fake`` one (rank 2), both
    B ≠ 0 so each changes the output; and the bare DiT's output on fixed inputs."""
    cfg = get_config("tiny")
    dit = Krea2DiT(cfg).eval()
    randomize(dit, seed=3)
    inputs = make_inputs(cfg)
    with torch.no_grad():
        bare = dit(*inputs)
    apply_lora(dit, LoraConfig(rank=4))
    apply_lora(dit, LoraConfig(rank=2), adapter="fake")
    with torch.no_grad():
        for name, p in dit.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.1 * torch.randn_like(p))
    return dit, {"bare": bare, "inputs": inputs}


def _out(dit, inputs):
    with torch.no_grad():
        return dit(*inputs)


def test_each_adapter_alone_or_none_and_requires_grad_untouched():
    dit, ref = _dit_with_two_adapters()
    inputs = ref["inputs"]
    grads = {n: p.requires_grad for n, p in dit.named_parameters()}
    assert {n for n, g in grads.items() if g} == {n for n in grads if ".lora_" in n}
    own = _out(dit, inputs)  # the stage's adapter is the one in use by default
    with adapter_in_use(dit, None):
        assert torch.equal(_out(dit, inputs), ref["bare"])  # the base: the teacher
    with adapter_in_use(dit, "fake"):
        fake = _out(dit, inputs)
        with adapter_in_use(dit, ADAPTER):  # nested: restored on the way out
            assert torch.equal(_out(dit, inputs), own)
        assert torch.equal(_out(dit, inputs), fake)
    assert torch.equal(_out(dit, inputs), own)
    assert not torch.allclose(own, fake) and not torch.allclose(own, ref["bare"])
    assert {n: p.requires_grad for n, p in dit.named_parameters()} == grads


def test_a_backward_reaches_only_the_adapter_in_use():
    dit, ref = _dit_with_two_adapters()
    with adapter_in_use(dit, "fake"):
        dit(*ref["inputs"]).square().mean().backward()
    got = {n for n, p in dit.named_parameters() if p.grad is not None}
    assert got and all(is_objective_adapter_key(n) for n in got)
    assert len(got) == sum(1 for n, _ in dit.named_parameters() if ".fake." in n)


def test_the_stage_adapter_is_exported_without_the_objectives():
    dit, _ = _dit_with_two_adapters()
    state = {f"model.dit.{k}": v for k, v in dit.state_dict().items()}
    out = adapter_tensors(state, "model.dit.")
    assert out and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in out)
    assert {v.shape[0] for k, v in out.items() if ".lora_A." in k} == {4}
    assert is_objective_adapter_key("blocks.0.attn.wq.lora_A.fake.weight")
    assert not is_objective_adapter_key("blocks.0.attn.wq.lora_A.default.weight")
    assert not is_objective_adapter_key("blocks.0.attn.wq.lora_A.weight")  # released
    assert is_stage_adapter_key("blocks.0.attn.wq.lora_B.default.weight")
    assert not is_stage_adapter_key("blocks.0.attn.wq.lora_B.fake.weight")
    assert not is_stage_adapter_key("blocks.0.attn.wq.base_layer.weight")


def test_reset_redraws_every_adapter_to_the_base():
    dit, ref = _dit_with_two_adapters()
    reset_lora(dit)  # B = 0 for both: each adapter alone is the base again
    for adapter in (ADAPTER, "fake"):
        with adapter_in_use(dit, adapter):
            assert torch.allclose(_out(dit, ref["inputs"]), ref["bare"], atol=1e-6)


def test_a_second_adapter_finds_linears_that_already_carry_one():
    dit, _ = _dit_with_two_adapters()
    targets = r"blocks\.0\.attn\.wq"
    names = apply_lora(dit, LoraConfig(rank=1, targets=targets), adapter="third")
    assert names == ["blocks.0.attn.wq"]
