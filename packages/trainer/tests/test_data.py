"""The Parquet reader: one bucket per batch, deterministic shuffle, keys from the step."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from krea2.infra.errors import UserError
from krea2.infra.shards import write_shard
from krea2.trainer.data import ShardIndex, StepBatches, batch_loader
from krea2.trainer.testing import toy_rows


@pytest.fixture
def mixed(tmp_path):
    """Two files; rows packed in runs of 4 of alternating buckets 32x32 / 48x32."""
    paths = []
    for f in range(2):
        rows = []
        for run in range(6):
            w = 32 if run % 2 == 0 else 48
            rows += toy_rows(4, w, 32, seed=10 * f + run, prefix=f"f{f}r{run}-")
        paths.append(
            write_shard(rows, tmp_path / f"m{f}.parquet", stage="toy", seed=0, batch_size=4)
        )
    return paths


def test_every_batch_has_one_bucket_and_each_epoch_covers_all(mixed):
    index = ShardIndex(mixed, global_batch=4, seed=1)
    assert len(index) == 12
    ds = StepBatches(index, rank=0, world=1, start=0, stop=24)
    seen = []
    for i in range(12):
        b = ds[i]
        assert len({m["cell"] for m in b["meta"]}) >= 1
        assert b["pixels"].shape[0] == 4 and b["pixels"].shape[1] == 3
        assert b["pixels"].shape[3] in (32, 48)
        seen.append(tuple(b["keys"]))
    assert len(set(seen)) == 12  # an epoch is a permutation of all batches
    second = {tuple(ds[i]["keys"]) for i in range(12, 24)}
    assert second == set(seen)


def test_order_is_deterministic_per_seed(mixed):
    a = [ShardIndex(mixed, 4, seed=1).batch_at(s) for s in range(12)]
    b = [ShardIndex(mixed, 4, seed=1).batch_at(s) for s in range(12)]
    c = [ShardIndex(mixed, 4, seed=2).batch_at(s) for s in range(12)]
    assert a == b and a != c


def test_batch_keys_recover_the_samples_of_any_step(mixed):
    index = ShardIndex(mixed, 4, seed=5)
    for step in (0, 7, 13):
        rank0 = StepBatches(index, 0, 2, step, step + 1)[0]["keys"]
        rank1 = StepBatches(index, 1, 2, step, step + 1)[0]["keys"]
        assert index.batch_keys(step) == rank0 + rank1


def test_worker_processes_give_the_same_batches(mixed):
    index = ShardIndex(mixed, 4, seed=3)
    inline = [b["keys"] for b in batch_loader(index, 0, 1, 5, 11, workers=0, prefetch=2)]
    pooled = [b["keys"] for b in batch_loader(index, 0, 1, 5, 11, workers=2, prefetch=2)]
    assert inline == pooled and len(inline) == 6


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_bad_sample_is_zero_weighted_logged_and_the_shape_kept(tmp_path):
    rows = toy_rows(4, 32, 32, seed=0)
    rows[2]["image"] = b"\x89PNG\r\n\x1a\n-truncated"
    path = write_shard(rows, tmp_path / "bad.parquet", stage="toy", seed=0, batch_size=4)
    ds = StepBatches(ShardIndex([path], 4, 0, shuffle=False), 0, 1, 0, 1)
    seen = _Collect()
    logger = logging.getLogger("krea2.trainer.data")
    logger.addHandler(seen)
    try:
        b = ds[0]
    finally:
        logger.removeHandler(seen)
    assert b["weight"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert b["pixels"].shape == (4, 3, 32, 32) and int(b["pixels"][2].sum()) == 0
    assert any(rows[2]["key"] in m for m in seen.messages)


def test_uri_rows_are_read_cropped_and_resized(tmp_path):
    from PIL import Image

    from krea2.trainer.testing import draw

    src = tmp_path / "big.png"
    Image.fromarray(draw(0, 4, 96, 64)).save(src)  # class 0: a red square, in the center
    rows = toy_rows(2, 32, 32, seed=0)
    for r in rows:
        r.update(image=None, uri=f"file://{src}", crop=[16, 0, 80, 64])
    path = write_shard(rows, tmp_path / "uri.parquet", stage="toy", seed=0, batch_size=2)
    b = StepBatches(ShardIndex([path], 2, 0), 0, 1, 0, 1)[0]
    assert b["weight"].tolist() == [1.0, 1.0]
    center = b["pixels"][0, :, 16, 16].tolist()
    assert center[0] > 200 and center[1] < 80  # the red square survived crop + resize


def test_shard_breaking_the_contract_is_named(tmp_path):
    bad = tmp_path / "x.parquet"
    pq.write_table(pa.table({"key": ["a"], "meta": [json.dumps({})]}), bad)
    with pytest.raises(UserError, match=r"x.parquet is missing column 'image'"):
        ShardIndex([bad], 4, 0)


def test_shard_without_the_contract_metadata_is_named(tmp_path):
    import pyarrow.parquet as pq

    from krea2.infra.shards import shard_arrow_schema

    rows = toy_rows(4, 32, 32, seed=0)
    bare = tmp_path / "bare.parquet"  # the contract's columns, but no stage or batch size
    pq.write_table(pa.Table.from_pylist(rows, schema=shard_arrow_schema()), bare)
    with pytest.raises(UserError, match=r"bare.parquet lacks the 'krea2.stage' file metadata"):
        ShardIndex([bare], 4, 0)


def test_unreadable_shard_is_named(tmp_path):
    torn = tmp_path / "torn.parquet"
    torn.write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match=r"torn.parquet is not a readable Parquet file"):
        ShardIndex([torn], 4, 0)


def test_batch_larger_than_every_run_is_explained(mixed):
    with pytest.raises(UserError, match=r"no run of 64 rows of one bucket"):
        ShardIndex(mixed, 64, 0)


KILLED_LOADER = """
import os, sys, time
from krea2.trainer.data import ShardIndex, batch_loader
if __name__ == "__main__":
    index = ShardIndex(sys.argv[1:], 4, seed=3)
    for batch in batch_loader(index, 0, 1, 0, 10_000, workers=1, prefetch=2):
        print("batch", flush=True)
        time.sleep(60)  # the workload: a slow trainer step, with its decode worker running
"""


def test_decode_workers_exit_when_the_trainer_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    # Batches larger than a pipe's buffer: an orphaned worker's queue thread then blocks
    # forever on a pipe nobody reads, so the DataLoader's own parent watchdog never exits it.
    rows = toy_rows(16, 256, 256, seed=0)
    shard = write_shard(rows, tmp_path / "big.parquet", stage="toy", seed=0, batch_size=4)
    script = tmp_path / "loader.py"
    script.write_text(KILLED_LOADER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(shard)], stdout=subprocess.PIPE, text=True
    )
    # Every moment after the first batch is the state this kill needs (a live worker the
    # trainer will never drain: 10 000 steps of a minute each), so it races nothing.
    assert proc.stdout.readline().strip() == "batch"  # the worker is up and decoding
    children = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and _parent_of(int(pid)) == proc.pid
    ]
    assert children
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Waits for the event (the kernel's PDEATHSIG kills them at once); the bound only ends a
    # failing run, so it is generous for a loaded machine.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(c) for c in children):
        time.sleep(0.05)
    assert not any(_alive(c) for c in children)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
