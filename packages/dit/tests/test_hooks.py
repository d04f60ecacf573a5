"""Trainer hooks: TP plan (2 gloo ranks), FSDP units, activation checkpointing, FLOP counter."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from krea2.dit.checkpointing import set_activation_checkpointing
from krea2.dit.config import get_config
from krea2.dit.flops import cost, param_count
from krea2.dit.model import Krea2DiT
from krea2.dit.parallel import check_tp_degree, fsdp_units, tp_partial_params, tp_plan
from krea2.dit.testing import count_flops as counted
from krea2.dit.testing import make_inputs, randomize
from krea2.infra.errors import UserError


@pytest.mark.parametrize(
    "overrides", [{}, {"timestep_tokens": 4}, {"attn_gate": False, "kv_heads": 1}]
)
def test_flop_and_param_counter_match_torch(overrides):
    cfg = get_config("tiny", **overrides)
    m = Krea2DiT(cfg)
    img, txt, t, pos, mask = make_inputs(cfg, text_len=7, grid=(3, 5))
    c = cost(cfg, batch=2, image_tokens=15, text_tokens=7)
    assert c.params == sum(p.numel() for p in m.parameters()) == param_count(cfg)
    assert counted(lambda: m(img, txt, t, pos, mask)) == c.forward_flops
    assert counted(lambda: m(img, txt, t, pos, mask).sum().backward()) == c.train_flops


def test_full_checkpointing_recomputes_block_forward_only():
    cfg = get_config("tiny")
    m = Krea2DiT(cfg)
    img, txt, t, pos, mask = make_inputs(cfg)
    set_activation_checkpointing(m, "full")
    got = counted(lambda: m(img, txt, t, pos, mask).sum().backward())
    assert got == cost(cfg, 2, 15, 7, checkpointing="full").train_flops
    assert got > cost(cfg, 2, 15, 7).train_flops


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_keeps_gradients(mode):
    cfg = get_config("tiny")
    m = Krea2DiT(cfg)
    randomize(m, 2)
    img, txt, t, pos, mask = make_inputs(cfg)
    m(img, txt, t, pos, mask).square().sum().backward()
    ref = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    set_activation_checkpointing(m, mode)
    m(img, txt, t, pos, mask).square().sum().backward()
    for k, p in m.named_parameters():
        torch.testing.assert_close(p.grad, ref[k], msg=k)


def test_selective_checkpointing_recomputes_no_matmul():
    cfg = get_config("tiny")
    m = Krea2DiT(cfg)
    img, txt, t, pos, mask = make_inputs(cfg)
    set_activation_checkpointing(m, "selective")
    got = counted(lambda: m(img, txt, t, pos, mask).sum().backward())
    assert got == cost(cfg, 2, 15, 7).train_flops  # saved matmuls are not re-run


def test_bad_checkpointing_mode():
    with pytest.raises(UserError, match="'sometimes'"):
        set_activation_checkpointing(Krea2DiT(get_config("tiny")), "sometimes")


def test_fsdp_units_cover_every_block():
    m = Krea2DiT(get_config("tiny", depth=3, layerwise_blocks=2))
    units = fsdp_units(m)
    assert len(units) == 3 + 2 + 1
    assert all(u in list(m.modules()) for u in units)


def test_tp_plan_covers_every_linear_except_the_projector():
    m = Krea2DiT(get_config("tiny"))
    plan = tp_plan(m, tp=2)
    linears = {n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    assert linears - set(plan) == {"txtfusion.projector"}
    assert set(plan) <= linears


def test_tp_partial_params_are_the_qk_norm_scales_of_every_planned_block():
    m = Krea2DiT(get_config("tiny", depth=3, layerwise_blocks=2))
    m.blocks[1].attn.qknorm.knorm.requires_grad_(False)
    got = tp_partial_params(m)
    want = [p for n, p in m.named_parameters() if ".attn.qknorm." in n and p.requires_grad]
    assert [id(p) for p in got] == [id(p) for p in want]
    assert len(got) == 2 * (3 + 2 + 1) - 1
    split_q = {n.removesuffix(".attn.wq") for n in tp_plan(m) if n.endswith(".attn.wq")}
    owners = {n.split(".attn.")[0] for n, _ in m.named_parameters() if ".qknorm." in n}
    assert owners == split_q  # every block whose q/k are column-split, and only those


def test_tp_degree_must_split_the_heads():
    check_tp_degree(get_config("krea2-12b"), 4)
    with pytest.raises(UserError, match=r"does not divide kv_heads=12 .* use one of \[1, 2, 4\]"):
        check_tp_degree(get_config("krea2-12b"), 8)


WORKER = Path(__file__).with_name("tp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
def test_tp_plan_on_two_gloo_ranks_equals_single_device(tmp_path):
    port, world, overrides = _free_port(), 2, {}
    env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(world), json.dumps(overrides), str(tmp_path)],
            env=env,
        )
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=180) == 0
    for r in range(world):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["kind"] == "DTensor"
        assert res["local_heads"] == 4 // world  # q heads split over ranks
        assert res["out_err"] < 1e-5 and res["grad_err"] < 1e-5
