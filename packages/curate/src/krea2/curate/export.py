"""Training-shard export: bucket by aspect ratio, crop+resize ahead of time, shuffle, pack.

Shards follow ``krea2.infra.shards`` (docs/architecture.md, contract 2). For a resolution stage of
side S, the buckets are the sizes of about S² pixels at the aspect ratios ``ASPECTS`` (both
orientations), each side a multiple of max(4, S/8): ``stage_buckets(256)`` is
256×256, 288×224, 224×288, 320×224, 224×320, 352×192, 192×352 (16:9 and 2:1 meet).
Each image goes to the bucket of nearest log-aspect, is centre-cropped to that aspect and
area-resized to the bucket. Rows are globally shuffled with ``seed``, then packed in runs of
``batch_size`` rows of one bucket, the runs shuffled again; a bucket's last incomplete run is
dropped (counted in the stats), so every batch a reader cuts is single-bucket.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np
from PIL import Image

from krea2.curate.decode import DecodeLimits, decode
from krea2.curate.left_out import DROPPED_FILE, dropped_tsv, packing_losses
from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.krablet import Warehouse

ASPECTS: tuple[float, ...] = (1.0, 4 / 3, 3 / 2, 16 / 9, 2.0)


def stage_buckets(side: int) -> list[tuple[int, int]]:
    """(width, height) buckets of about side² pixels (see the module docstring)."""
    m = max(4, side // 8)
    out: list[tuple[int, int]] = []
    for a in ASPECTS:
        w = max(m, round(side * math.sqrt(a) / m) * m)
        h = max(m, round(side / math.sqrt(a) / m) * m)
        for b in ((w, h), (h, w)):
            if b not in out:
                out.append(b)
    return out


def nearest_bucket(width: int, height: int, buckets: Sequence[tuple[int, int]]) -> tuple[int, int]:
    target = math.log(width / height)
    return min(buckets, key=lambda b: abs(math.log(b[0] / b[1]) - target))


def centre_crop_box(width: int, height: int, bucket: tuple[int, int]) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the largest centred box with the bucket's aspect."""
    aspect = bucket[0] / bucket[1]
    if width / height > aspect:
        w = round(height * aspect)
        left = (width - w) // 2
        return left, 0, left + w, height
    h = round(width / aspect)
    top = (height - h) // 2
    return 0, top, width, top + h


@dataclass(frozen=True)
class Sample:
    """One image to export: ``captions`` maps caption format → text; ``meta`` is JSON-able."""

    key: str
    data: bytes
    captions: dict[str, str]
    uri: str | None = None
    meta: dict = field(default_factory=dict)


@dataclass
class ExportStats:
    """Rows written, files, a bucket's incomplete last run dropped, samples that failed to
    decode, rows skipped for want of captions, rows per bucket, the batch size the rows were
    packed in, and (from the warehouse) the kept rows there were to export. ``dropped_keys``
    and ``failed_keys`` name the dropped and undecodable samples; ``folder`` says in one
    line what happened to the output folder (``ExportFolder.note``); ``caption_error``:
    an error the captions job recorded on a row still without captions."""

    rows: int = 0
    files: int = 0
    dropped_tail: int = 0
    failed: int = 0
    uncaptioned: int = 0
    buckets: dict[str, int] = field(default_factory=dict)
    batch_size: int = 0
    kept: int | None = None
    dropped_keys: list[str] = field(default_factory=list)
    failed_keys: list[str] = field(default_factory=list)
    folder: str = ""
    caption_error: str | None = None

    def shortfall(self) -> list[str]:
        """Why fewer rows were written than there were images, each with what to change
        (empty when nothing was lost)."""
        out = []
        if self.kept == 0:
            out.append(
                "no kept images in the warehouse: ingest some and run `krea2 curate run` "
                "(analyze, dedup, ocr) first"
            )
        if self.uncaptioned:
            failed = (
                f" (the captions stage failed on them, e.g. {self.caption_error[:300]})"
                if self.caption_error
                else ""
            )
            out.append(
                f"{self.uncaptioned} kept images have no captions and were skipped{failed}: run "
                "`krea2 curate run --stages captions --captioner NAME` (sidecar: captions from "
                "<stem>.txt / <stem>.json sidecars; shapes: ShapesWorld scenes)"
            )
        if self.failed:
            out.append(f"{self.failed} images failed to decode and were skipped")
        if self.dropped_tail:
            out.append(
                f"{self.dropped_tail} rows dropped (named in dropped.tsv): each bucket keeps "
                f"only whole batches of {self.batch_size} rows; a smaller --batch-size keeps more"
            )
        return out


def _encode(pixels: np.ndarray, image_format: str) -> bytes:
    buf = io.BytesIO()
    if image_format == "png":
        Image.fromarray(pixels).save(buf, format="PNG")
    else:
        Image.fromarray(pixels).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def prepare(sample: Sample, buckets: Sequence[tuple[int, int]], image_format: str) -> dict:
    """Decode at full size, crop and resize to the nearest bucket → a shard row."""
    longest = max(max(b) for b in buckets)
    # Decode no smaller than twice the bucket's longest side, so the resize averages pixels.
    img = decode(sample.data, DecodeLimits(analysis_size=max(2 * longest, 64)))
    h, w = img.pixels.shape[:2]
    bucket = nearest_bucket(w, h, buckets)
    left, top, right, bottom = centre_crop_box(w, h, bucket)
    crop = img.pixels[top:bottom, left:right]
    pixels = cv2.resize(crop, bucket, interpolation=cv2.INTER_AREA)
    s = img.width / w  # crop box in original pixels, for the uri + crop form
    box = [round(left * s), round(top * s), round(right * s), round(bottom * s)]
    return {
        "key": sample.key,
        "image": _encode(pixels, image_format),
        "uri": sample.uri,
        "crop": box,
        "width": bucket[0],
        "height": bucket[1],
        "bucket": f"{bucket[0]}x{bucket[1]}",
        "captions": [{"format": f, "text": t} for f, t in sample.captions.items()],
        "meta": json.dumps(sample.meta | {"source_size": [img.width, img.height]}),
    }


AUTO_BATCH_SIZES = (32, 16, 8, 4, 2, 1)


def auto_batch_size(bucket_rows: Sequence[int], most_dropped: float = 0.25) -> int:
    """The largest of ``AUTO_BATCH_SIZES`` whose incomplete runs drop at most
    ``most_dropped`` of the rows, given the rows per bucket (32 for any sizeable set; a
    small set gets a batch it can fill)."""
    total = sum(bucket_rows)
    for b in AUTO_BATCH_SIZES:
        if sum(n % b for n in bucket_rows) <= most_dropped * total:
            return b
    return 1


def pack(rows: list[dict], batch_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Shuffle globally, group into single-bucket runs of ``batch_size``, shuffle the runs.
    Returns (rows in write order, the tail rows dropped)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(rows))
    by_bucket: dict[str, list[dict]] = {}
    for i in order:
        by_bucket.setdefault(rows[i]["bucket"], []).append(rows[i])
    runs: list[list[dict]] = []
    dropped: list[dict] = []
    for bucket in sorted(by_bucket):
        members = by_bucket[bucket]
        full = len(members) - len(members) % batch_size
        runs += [members[i : i + batch_size] for i in range(0, full, batch_size)]
        dropped += members[full:]
    return [r for k in rng.permutation(len(runs)) for r in runs[k]], dropped


def export_shards(
    samples: Iterable[Sample],
    out_dir: Path,
    stage: str,
    side: int,
    seed: int = 0,
    batch_size: int | None = None,
    rows_per_file: int = 4096,
    image_format: str = "png",
    stats: ExportStats | None = None,
    side_files: Callable[[ExportStats], Mapping[str, str]] | None = None,
) -> ExportStats:
    """Write ``out_dir/shard-NNNNN.parquet`` files for ``samples`` (deterministic for a seed).

    ``out_dir`` is new, empty or holds a previous export (``export_folder``): that export's
    files are replaced whole, anything else there is a user error (checked first).
    ``side_files(stats)``, once the rows are packed (``dropped_keys``, ``failed_keys``
    known): ``{name: text}`` written beside the shards as part of the export.

    ``batch_size`` None: ``auto_batch_size`` of the rows per bucket. Each file holds whole
    batches (``rows_per_file`` is rounded down to a multiple of ``batch_size``) and records
    ``krea2.stage``, ``krea2.seed`` and ``krea2.batch_size``.
    A sample that cannot be decoded is counted in ``failed`` and skipped. Files are written
    by ``krea2.infra.shards.write_shard`` (validated, then renamed into place). ``stats``:
    counts to add to (e.g. ``uncaptioned`` from ``warehouse_samples``).
    """
    from krea2.curate.decode import DecodeError
    from krea2.curate.export_folder import ExportFolder
    from krea2.infra.shards import write_shard

    if batch_size is not None and (batch_size < 1 or rows_per_file < batch_size):
        raise UserError(f"need 1 <= batch_size <= rows_per_file, got {batch_size}, {rows_per_file}")
    if image_format not in ("png", "jpeg"):
        raise UserError(f"image format {image_format!r}: use 'png' or 'jpeg'")
    folder = ExportFolder.claim(out_dir)  # before the work: refused folders fail fast
    buckets = stage_buckets(side)
    stats = stats or ExportStats()
    rows = []
    for s in samples:
        try:
            rows.append(prepare(s, buckets, image_format))
        except DecodeError:
            stats.failed += 1
            stats.failed_keys.append(s.key)
    if batch_size is None:
        per_bucket: dict[str, int] = {}
        for r in rows:
            per_bucket[r["bucket"]] = per_bucket.get(r["bucket"], 0) + 1
        batch_size = min(auto_batch_size(list(per_bucket.values())), rows_per_file)
    stats.batch_size = batch_size
    ordered, dropped = pack(rows, batch_size, seed)
    stats.dropped_tail, stats.dropped_keys = len(dropped), [r["key"] for r in dropped]
    per_file = rows_per_file - rows_per_file % batch_size
    starts = range(0, len(ordered), per_file)
    names = [f"shard-{n:05d}.parquet" for n in range(len(starts))]
    extra = dict(side_files(stats)) if side_files is not None else {}
    folder.begin([*names, *extra])
    for name, start in zip(names, starts, strict=True):
        write_shard(
            ordered[start : start + per_file],
            folder.path / name,
            stage=stage,
            seed=seed,
            batch_size=batch_size,
            row_group_size=batch_size * 16,
        )
        stats.files += 1
    for name, text in extra.items():
        folder.write(name, text)
    folder.finish([*names, *extra])
    stats.folder = folder.note()
    stats.rows = len(ordered)
    for r in ordered:
        stats.buckets[r["bucket"]] = stats.buckets.get(r["bucket"], 0) + 1
    return stats


def warehouse_samples(rows: Iterable[dict], stats: ExportStats) -> Iterator[Sample]:
    """Export samples of warehouse rows (``image_key``, ``uri``, ``source``, ``md5``,
    ``meta``, ``captions``); a row without captions is skipped and counted in
    ``stats.uncaptioned``. A sample's meta is the row's ingest metadata plus its source and
    md5."""
    from krea2.curate.storage import read_uri

    for r in rows:
        captions = {c["format"]: c["text"] for c in r.get("captions") or ()}
        if not captions:
            stats.uncaptioned += 1
            continue
        meta = (r.get("meta") or {}) | {"source": r["source"], "md5": r["md5"]}
        yield Sample(r["image_key"], read_uri(r["uri"]), captions, r["uri"], meta)


def weighted(rows: list[dict], seed: int) -> list[dict]:
    """``rows`` with each one repeated by its ``sample_weight`` (the coverage pass's rare
    concept weight; None = 1): the whole part, plus one with probability the fraction,
    seeded. A repeat's key gets ``#r<n>`` (the image is the same)."""
    from krea2.curate.coverage import repeats

    w = np.asarray([r.get("sample_weight") or 1.0 for r in rows], np.float64)
    if not (w != 1.0).any():
        return rows
    out = []
    for r, n in zip(rows, repeats(w, seed).tolist(), strict=True):
        out += [r] + [{**r, "image_key": f"{r['image_key']}#r{k}"} for k in range(1, n)]
    return out


def dropped_rows_file(stats: ExportStats) -> dict[str, str]:
    """``export_shards``' ``side_files`` for the warehouse export: the rows it left out by
    key (``left_out.packing_losses``) in ``dropped.tsv`` beside the shards; nothing when
    every row was written."""
    rows = packing_losses(stats.batch_size, stats.dropped_keys, stats.failed_keys)
    return {DROPPED_FILE: dropped_tsv("image_key", rows)} if rows else {}


def export_warehouse(
    wh: Warehouse,
    out_dir: Path,
    side: int,
    stage: str | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    rows_per_file: int = 4096,
    image_format: str = "png",
    progress: Callable[[Iterator[Sample], int], Iterable[Sample]] | None = None,
) -> ExportStats:
    """``export_shards`` of the warehouse's kept rows (``kept_rows``), with the captions the
    ``captions`` stage wrote; rows without captions are skipped (``stats.uncaptioned``), and
    rows packing or decoding left out are named in ``dropped.tsv`` (``dropped_rows_file``).
    ``stage`` defaults to ``str(side)``; ``progress(samples, total)`` may wrap the samples
    (e.g. ``rich.progress.track``)."""
    from krea2.curate.warehouse import kept_rows

    kept = kept_rows(wh, ["uri", "source", "md5", "meta", "captions", "sample_weight"])
    stats = ExportStats(kept=len(kept))
    rows = weighted(kept, seed)  # rare-concept rows repeated (coverage pass)
    samples: Iterable[Sample] = warehouse_samples(rows, stats)
    if progress is not None:
        samples = progress(samples, len(rows))  # type: ignore[arg-type]
    stats = export_shards(
        samples, out_dir, stage or str(side), side, seed, batch_size, rows_per_file,
        image_format, stats, side_files=dropped_rows_file,
    )  # fmt: skip
    if stats.uncaptioned:
        stats.caption_error = caption_error(wh)
    return stats


def caption_error(wh: Warehouse) -> str | None:
    """An error the captions job recorded on a row it has not done (why rows are still
    uncaptioned, e.g. no sidecar caption), or None."""
    from krea2.curate.stages import TABLE

    queue = wh.queue(TABLE, "captions")
    for shard in range(len(wh.cluster)):
        for row in queue.errors(shard, limit=1):
            return str(row["last_error"]).split(": ", 1)[-1]  # less the "module.Type: "
    return None
