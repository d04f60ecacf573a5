"""Checkpoint speed: sync-save throughput vs plain file writes, and async blocking time.

For a training state of about 1 GiB of float32 tensors (16 × 64 MiB) this measures, in
one run on the same disk:

* plain buffered file writes of the same bytes, fsynced (the ceiling for one writer);
* ``CheckpointManager.save`` (DCP files, fsyncs, manifest, rename, marker);
* ``CheckpointManager.async_save``: the time the caller is blocked (host staging) and
  the time until the checkpoint is durable.

With ``--gloo`` the process first joins a 1-rank gloo group, as under torchrun, so the
manager's own gloo group and DCP's collectives are part of the measurement.

Targets: sync throughput ≥ 0.7 × plain writes; async blocking ≤ 0.1 × sync save.
Run: ``uv run python -m benchmarks.checkpoint [--gib 1.0] [--repeats 3] [--device cpu|cuda]
[--gloo]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.report import table, write_results
from krea2.infra.checkpoint import CheckpointManager


def make_state(gib: float, device: str, n: int = 16) -> dict[str, torch.Tensor]:
    numel = int(gib * 2**30 / 4 / n)
    g = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(numel, generator=g).to(device) for i in range(n)}


def plain_write(state: dict[str, torch.Tensor], directory: Path) -> float:
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(directory / "plain.bin", "wb") as f:
        for tensor in state.values():
            f.write(memoryview(tensor.cpu().numpy()).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    shutil.rmtree(directory)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="where the state lives (cpu, cuda)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    parser.add_argument("--gloo", action="store_true", help="run inside a 1-rank gloo group")
    args = parser.parse_args()
    if args.gloo:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix="krea2-ckpt-bench-"))
    state = make_state(args.gib, args.device)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    manager = CheckpointManager(base / "ckpt", keep_last=1)

    plain, sync, blocked, durable = [], [], [], []
    manager.async_save(0, state).wait()  # allocate the reusable staging buffers once
    for step in range(1, args.repeats + 1):
        plain.append(plain_write(state, base / "plain"))
        start = time.perf_counter()
        manager.save(2 * step, state)
        sync.append(time.perf_counter() - start)
        start = time.perf_counter()
        pending = manager.async_save(2 * step + 1, state)
        blocked.append(time.perf_counter() - start)
        pending.wait()
        durable.append(time.perf_counter() - start)
    shutil.rmtree(base)
    if args.gloo:
        dist.destroy_process_group()

    med = statistics.median
    gib = nbytes / 2**30
    results = {
        "bytes": nbytes,
        "plain_write_s": med(plain),
        "sync_save_s": med(sync),
        "async_blocked_s": med(blocked),
        "async_durable_s": med(durable),
        "sync_throughput_ratio": med(plain) / med(sync),
        "async_block_ratio": med(blocked) / med(sync),
    }
    rows = [
        ["plain buffered writes + fsync", f"{med(plain):.2f}", f"{gib / med(plain):.2f}", "1.00"],
        [
            "CheckpointManager.save (sync)",
            f"{med(sync):.2f}",
            f"{gib / med(sync):.2f}",
            f"{results['sync_throughput_ratio']:.2f} (target ≥ 0.7)",
        ],
        [
            "async_save: caller blocked",
            f"{med(blocked):.3f}",
            "–",
            f"{results['async_block_ratio']:.3f} of sync (target ≤ 0.1)",
        ],
        ["async_save: until durable", f"{med(durable):.2f}", f"{gib / med(durable):.2f}", "–"],
    ]
    markdown = (
        f"## Checkpoints{', 1-rank gloo group' if args.gloo else ''} on {args.device} "
        "(`benchmarks/checkpoint.py`)\n\n"
        f"{gib:.2f} GiB of float32 tensors (16 tensors) on {args.device}"
        f"{', 1-rank gloo group' if args.gloo else ''}, median of {args.repeats}, same disk. "
        "On CPU the async save's blocking part is a host memcpy "
        "(memory bandwidth), on GPU a device-to-host copy into pinned buffers.\n\n"
        + table(["what", "seconds", "GiB/s", "ratio"], rows)
    )
    write_results(f"checkpoint-{args.device}{'-gloo' if args.gloo else ''}", results, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
