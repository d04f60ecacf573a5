"""Child process for the checkpoint fault tests: saves, then stops at a chosen point.

Usage: python ckpt_child.py ROOT STOP_AT, where STOP_AT is one of
``manifest`` (tensors written, not yet renamed), ``marker`` (renamed, no COMPLETE
marker yet) or ``write`` (in the middle of writing tensors: one item's bytes are in a file,
the rest are not). At the stop point the child prints ``STOPPED`` and sleeps until the
parent SIGKILLs it, so the save cannot get past that point whatever the machine's speed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from krea2.infra import checkpoint
from krea2.infra.checkpoint import CheckpointManager


def state_for(step: int, mib: int = 8) -> dict:
    torch.manual_seed(step)
    n = mib * 2**20 // 4
    return {"model": {"w": torch.randn(n)}, "step_tensor": torch.tensor(step)}


def hang() -> None:
    print("STOPPED", flush=True)
    time.sleep(600)


def main() -> None:
    root, stop_at = sys.argv[1], sys.argv[2]
    manager = CheckpointManager(root, keep_last=5)
    manager.save(1, state_for(1), {"step": 1})
    print("SAVED 1", flush=True)
    if stop_at == "manifest":
        checkpoint.write_manifest = lambda *a, **k: hang()
    elif stop_at == "marker":
        real = checkpoint.write_durably

        def write_durably(path, data):
            if path.name == "COMPLETE":
                hang()
            real(path, data)

        checkpoint.write_durably = write_durably
    elif stop_at == "write":
        from torch.distributed.checkpoint import filesystem

        real_item = filesystem._write_item

        def write_item(transforms, stream, *args, **kwargs):
            result = real_item(transforms, stream, *args, **kwargs)
            stream.flush()  # these bytes are on disk, in the temporary directory
            hang()
            return result

        filesystem._write_item = write_item
    manager.save(2, state_for(2), {"step": 2})


def two_rank_worker(rank: int, tmp: str) -> None:
    """One of two gloo ranks: save sharded DTensors sync and async, reload them."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        w = distribute_tensor(torch.arange(32.0).reshape(8, 4), mesh, [Shard(0)])
        state = {"model": {"w": w}, "bias": torch.ones(3)}
        manager = CheckpointManager(Path(tmp) / "ckpt")
        manager.save(1, state, {"rank": rank, "data_position": rank * 100})
        pending = manager.async_save(2, state, {"rank": rank, "data_position": rank})
        w.to_local().mul_(0)  # the caller's tensors change while the save is in flight
        pending.wait()
        fresh = {
            "model": {"w": distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)])},
            "bias": torch.zeros(3),
        }
        extra = manager.load(fresh)
        assert extra == {"rank": rank, "data_position": rank}
        expected = torch.arange(32.0).reshape(8, 4)[rank * 4 : (rank + 1) * 4]
        assert torch.equal(fresh["model"]["w"].to_local(), expected)
        assert manager.load(fresh, step=1)["data_position"] == rank * 100
        dist.barrier()  # neither rank tears gloo down under the other's last collective
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
