"""Pack what gpu.py's ``rl`` part needs from a demo into a folder the device tool carries
(``carry=["gpu-kit"]``, at most 64 MiB): the newest complete checkpoint of each pretraining
stage and its done marker (``gpu-kit/demo/run/checkpoints/``) and the stages' exported
shards (``gpu-kit/demo/shards/``: the job checks its data exists; under 1 MiB). The GPU
machine has no demo and reaches no registry, and pretraining again there would spend its
minutes.

    uv run python -m benchmarks.gpu_kit --demo /tmp/demo --out gpu-kit

``--demo``: a ``krea2 demo --out DIR`` (full or ``--quick``) whose pretraining finished.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

CARRY_LIMIT = 64 * 2**20  # bytes the device tool carries in all


def pack(demo: Path, out: Path) -> dict:
    """Copy the pretraining checkpoints and shards of ``demo`` into ``out/demo`` (replacing it);
    returns ``{"stages": {name: step}, "bytes": n}``. SystemExit with the reason when the
    pretraining is unfinished or the kit would not fit the carry limit."""
    from krea2.infra import CheckpointManager
    from krea2.pipeline.config import demo_training_job, load_demo_config

    job, finished = demo_training_job(load_demo_config(False), demo)
    if not finished:
        raise SystemExit(f"{demo}: its pretraining has not finished; run krea2 demo --out {demo}")
    target = out / "demo" / "run" / "checkpoints"
    if (out / "demo").exists():
        shutil.rmtree(out / "demo")
    target.mkdir(parents=True)
    stages, size = {}, 0
    for stage in job.stages:
        src = Path(job.run_dir) / "checkpoints" / stage.name
        manager = CheckpointManager(src)
        step = manager.latest_step()
        if step is None:
            raise SystemExit(f"{src}: no complete checkpoint")
        newest = manager.path_of(step)
        copied = shutil.copytree(newest, target / stage.name / newest.name)
        shutil.copy2(src.parent / f"{stage.name}.done", target / f"{stage.name}.done")
        shards = shutil.copytree(demo / "shards" / stage.name, out / "demo" / "shards" / stage.name)
        size += sum(f.stat().st_size for d in (copied, shards) for f in Path(d).rglob("*")
                    if f.is_file())  # fmt: skip
        stages[stage.name] = step
    if size > CARRY_LIMIT:
        raise SystemExit(f"the kit holds {size / 2**20:.1f} MiB, over the device tool's 64 MiB")
    return {"stages": stages, "bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", type=Path, required=True, help="a demo's --out with pretraining done")
    ap.add_argument("--out", type=Path, default=Path("gpu-kit"))
    args = ap.parse_args()
    kit = pack(args.demo, args.out)
    print(f"{args.out}: {kit['stages']} ({kit['bytes'] / 2**20:.1f} MiB); "
          f'carry it: run(command=..., carry=["{args.out}"])')  # fmt: skip


if __name__ == "__main__":
    main()
