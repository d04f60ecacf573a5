"""The Parquet reader of the training-shard contract: one bucket per batch, replayable by step.

Shards are pre-shuffled and packed by curate, so consecutive rows of one bucket form
batches. The reader indexes those runs once (reading only the ``bucket`` column), cuts
them into global batches, and orders the batches per epoch with a permutation drawn from
``(seed, epoch)``. The batch of training step ``s`` is therefore a pure function of the
seed and ``s``: the data position is the step number, and :meth:`ShardIndex.batch_keys`
recovers the keys of every sample behind any step (e.g. a loss spike).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from krea2.infra.errors import UserError
from krea2.infra.logging import get_logger
from krea2.infra.shards import (
    METADATA_BATCH_SIZE,
    METADATA_STAGE,
    ShardSchemaError,
    parse_bucket,
    validate_shard_file,
)

log = get_logger("trainer.data")


@dataclass(frozen=True)
class BatchRef:
    """Rows ``[start, stop)`` of file ``file`` (an index into ShardIndex.files), one bucket."""

    file: int
    start: int
    stop: int
    bucket: str

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return parse_bucket(self.bucket)


class ShardIndex:
    """Global batches over Parquet shards and their per-epoch order.

    Args:
        files: shard paths, in the order curate wrote them.
        global_batch: rows per global batch (all ranks together).
        seed: shuffle seed; the order of epoch e is a permutation drawn from (seed, e).
        shuffle: False keeps file order (evaluation).
    """

    def __init__(
        self,
        files: list[Path],
        global_batch: int,
        seed: int,
        shuffle: bool = True,
        where: str = "shards",
        setting: str = "batch_size",
    ):
        import pyarrow.parquet as pq

        self.files = [Path(f) for f in files]
        self.global_batch = global_batch
        self.seed = seed
        self.shuffle = shuffle
        self.stages: set[str] = set()
        batches: list[BatchRef] = []
        longest, rows, packing = 0, 0, set()
        for fi, path in enumerate(self.files):
            try:
                validate_shard_file(path)
            except ShardSchemaError as exc:
                raise UserError(str(exc)) from None
            pf = pq.ParquetFile(path)
            meta = pf.schema_arrow.metadata or {}
            if METADATA_STAGE in meta:
                self.stages.add(meta[METADATA_STAGE].decode())
            packed = int(meta.get(METADATA_BATCH_SIZE, b"0") or 0)
            packing.add(packed)
            if packed and global_batch % packed and packed % global_batch:
                log.warning(
                    "shard %s is packed in runs of %d rows; batch %d splits runs",
                    path,
                    packed,
                    global_batch,
                )
            buckets = pf.read(columns=["bucket"], use_threads=False).column(0).to_pylist()
            batches += self._runs(fi, buckets)
            rows += len(buckets)
            longest = max(longest, longest_run(buckets))
        if not batches:
            packed = max(packing, default=0)
            fits = packed if 0 < packed <= longest else longest
            raise UserError(
                f"{where}: {setting}={global_batch}, but the {rows} rows in "
                f"{len(self.files)} file(s) hold no run of {global_batch} rows of one bucket "
                f"(the longest is {longest}; packed in runs of {packed or 'unknown size'}); "
                f"set {setting} = {fits}, or prepare the shards with --batch-size {global_batch} "
                f"from at least {global_batch} images per bucket"
            )
        self.batches = batches

    def _runs(self, fi: int, buckets: list[str]) -> list[BatchRef]:
        out, start = [], 0
        for i in range(1, len(buckets) + 1):
            if i == len(buckets) or buckets[i] != buckets[start]:
                for s in range(start, i - self.global_batch + 1, self.global_batch):
                    out.append(BatchRef(fi, s, s + self.global_batch, buckets[start]))
                start = i
        return out

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.batches)

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.batches))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.batches))

    def batch_at(self, step: int) -> BatchRef:
        """The global batch consumed at training step ``step`` (epochs wrap around)."""
        epoch, i = divmod(step, len(self.batches))
        return self.batches[int(self.order(epoch)[i])]

    def batch_keys(self, step: int) -> list[str]:
        """Sample keys of step ``step``'s global batch, in rank order."""
        import pyarrow.parquet as pq

        ref = self.batch_at(step)
        table = pq.read_table(self.files[ref.file], columns=["key"], use_threads=False)
        return table.column(0).slice(ref.start, ref.stop - ref.start).to_pylist()


def longest_run(buckets: list[str]) -> int:
    """The most consecutive rows of one bucket (a batch is cut from such a run)."""
    best = run = 0
    for i, bucket in enumerate(buckets):
        run = run + 1 if i and bucket == buckets[i - 1] else 1
        best = max(best, run)
    return best


def _decode(row: dict, width: int, height: int) -> np.ndarray:
    """Row -> uint8 [3, H, W]; bytes from ``image`` or the local file named by ``uri``."""
    from PIL import Image

    if row["image"] is not None:
        img = Image.open(io.BytesIO(row["image"]))
    else:
        uri = row["uri"].removeprefix("file://")
        img = Image.open(uri)
        if row["crop"] is not None:
            img = img.crop(tuple(row["crop"]))
        img = img.resize((width, height), Image.Resampling.BICUBIC)
    img = img.convert("RGB")
    if img.size != (width, height):
        raise ValueError(f"image is {img.size[0]}x{img.size[1]}, bucket is {width}x{height}")
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def _decode_reference(data: bytes | None, width: int, height: int) -> np.ndarray:
    """A row's ``reference`` image bytes -> uint8 [3, H, W] at the bucket's size."""
    from PIL import Image

    if data is None:
        raise ValueError("the row has no reference image")
    img = Image.open(io.BytesIO(data)).convert("RGB")
    if img.size != (width, height):
        img = img.resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


class StepBatches(torch.utils.data.Dataset):
    """Item ``i`` = this rank's share of the batch of step ``start + i``, decoded.

    Returns a dict: ``pixels`` uint8 [b, 3, H, W], ``weight`` float [b] (0 = undecodable
    sample, zero-filled so every rank keeps the same shape), ``captions`` (per sample a
    list of {format, text}), ``keys``, ``step``; ``reference_pixels`` uint8 [b, 3, H, W]
    when the shards have a ``reference`` column.
    """

    def __init__(self, index: ShardIndex, rank: int, world: int, start: int, stop: int):
        if index.global_batch % world:
            raise UserError(f"batch {index.global_batch} does not split over {world} ranks")
        self.index, self.rank, self.world = index, rank, world
        self.start, self.stop = start, stop
        self._file: tuple[int, Any] | None = None

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def _rows(self, ref: BatchRef, lo: int, hi: int) -> list[dict]:
        import pyarrow.parquet as pq

        if self._file is None or self._file[0] != ref.file:
            self._file = (ref.file, pq.ParquetFile(self.index.files[ref.file]))
        pf = self._file[1]
        # Read only the row groups covering [lo, hi).
        groups, offset, first = [], 0, None
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if offset + n > lo and offset < hi:
                groups.append(g)
                first = offset if first is None else first
            offset += n
        table = pf.read_row_groups(groups, use_threads=False)
        return table.slice(lo - first, hi - lo).to_pylist()

    def __getitem__(self, i: int) -> dict[str, Any]:
        step = self.start + i
        ref = self.index.batch_at(step)
        local = self.index.global_batch // self.world
        lo = ref.start + self.rank * local
        rows = self._rows(ref, lo, lo + local)
        width, height = ref.size
        pixels = np.zeros((local, 3, height, width), dtype=np.uint8)
        weight = np.ones(local, dtype=np.float32)
        # an image-conditioned stage's shards (e.g. style references) carry a second
        # image per row in ``reference`` (encoded bytes, resized to the bucket)
        with_reference = bool(rows) and "reference" in rows[0]
        references = np.zeros_like(pixels) if with_reference else None
        for j, row in enumerate(rows):
            try:
                pixels[j] = _decode(row, width, height)
                if references is not None:
                    references[j] = _decode_reference(row["reference"], width, height)
            except Exception as exc:  # any undecodable sample is skipped, never fatal
                weight[j] = 0.0
                log.warning("skipping bad sample %s at step %d: %s", row["key"], step, exc)
        extra = {} if references is None else {"reference_pixels": torch.from_numpy(references)}
        return {
            **extra,
            "pixels": torch.from_numpy(pixels),
            "weight": torch.from_numpy(weight),
            "captions": [row["captions"] for row in rows],
            "keys": [row["key"] for row in rows],
            "meta": [json.loads(row["meta"]) if row["meta"] else {} for row in rows],
            "step": step,
        }


def _exit_with_parent(_worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: a decode worker dies with the training process and
    leaves Ctrl-C to it.

    Without it a trainer killed by SIGKILL (OOM killer, preemption, a user) leaves its
    workers running, orphaned, decoding batches nobody reads. Linux only; elsewhere the
    DataLoader's own parent watchdog remains.
    """
    import ctypes
    import os
    import signal
    import sys

    # Ctrl-C in a terminal signals the whole process group: the trainer stops the workers
    # itself (finishing its checkpoint), so a worker must not die mid-batch on its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def batch_loader(
    index: ShardIndex, rank: int, world: int, start: int, stop: int, workers: int, prefetch: int
):
    """Iterate the batches of steps ``[start, stop)`` in order, decoded by ``workers``
    processes (spawned: forking after pyarrow's thread pools started is unsafe) that exit
    when the training process does, however it ends."""
    ds = StepBatches(index, rank, world, start, stop)
    if workers == 0:
        return (ds[i] for i in range(len(ds)))
    return torch.utils.data.DataLoader(
        ds,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        prefetch_factor=prefetch,
        multiprocessing_context="spawn",
        persistent_workers=False,
        worker_init_fn=_exit_with_parent,
    )
