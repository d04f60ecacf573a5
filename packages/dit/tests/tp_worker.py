"""One rank of the 2-rank gloo tensor-parallel test (run by test_hooks.py, not collected)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from krea2.dit.config import get_config
from krea2.dit.model import Krea2DiT
from krea2.dit.parallel import tp_plan
from krea2.dit.testing import make_inputs, randomize


def main(rank: int, world: int, overrides: dict, out: Path) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        cfg = get_config("tiny", **overrides)
        m = Krea2DiT(cfg)
        randomize(m, 5)
        img, txt, t, pos, mask = make_inputs(cfg)
        want = m(img, txt, t, pos, mask)
        want.square().sum().backward()
        gref = m.blocks[0].attn.wq.weight.grad.clone()
        m.zero_grad()
        parallelize_module(m, init_device_mesh("cpu", (world,)), tp_plan(m, tp=world))
        got = m(img, txt, t, pos, mask)
        got.square().sum().backward()
        wq = m.blocks[0].attn.wq.weight
        res = {
            "kind": type(wq).__name__,
            "local_heads": wq.to_local().shape[0] // cfg.head_dim,
            # max abs error relative to the reference's scale
            "out_err": ((got - want).abs().max() / want.abs().max()).item(),
            "grad_err": ((wq.grad.full_tensor() - gref).abs().max() / gref.abs().max()).item(),
        }
        (out / f"rank{rank}.json").write_text(json.dumps(res))
        # both ranks finish their last collective before either tears gloo down; without
        # this the slower rank can abort ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), Path(sys.argv[4]))
