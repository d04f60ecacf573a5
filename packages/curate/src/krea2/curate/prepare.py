"""A user's folder of captioned images -> training shards, through the same decode checks,
cheap filters, exact/near dedup and aspect buckets as the warehouse.

Captions follow the sidecar convention of ``krea2 curate ingest`` (``krea2.curate.sidecars``:
``<stem>.txt``, or ``"caption"``/``"captions"`` in ``<stem>.json``), read by the same
function. Fine-tuning sets are small (tens to thousands of images), so the DAG runs in
memory (:func:`krea2.curate.curate_in_memory`) instead of through Postgres; each kept image
is exported by :func:`krea2.curate.export_shards`. Every image that does not reach the
shards is named with its reason in ``dropped.tsv`` beside them. Run it as
``python -m krea2.curate.prepare FOLDER --out shards/ --side 1024``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from krea2.curate.left_out import DROPPED_FILE, INCOMPLETE_BATCH, dropped_tsv, packing_losses
from krea2.infra.errors import UserError

if TYPE_CHECKING:
    from krea2.curate.export import ExportStats

NO_CAPTION = "no_caption"


@dataclass(frozen=True)
class Dropped:
    """An image (path relative to the folder) that is not in the shards, and why: a filter's
    reason, ``exact_duplicate``/``near_duplicate`` (``detail``: of which image),
    ``no_caption``, ``incomplete_batch`` or a file skipped as not an image."""

    image: str
    reason: str
    detail: str = ""


@dataclass
class PrepareResult:
    """What became of a folder: images found, rejects by reason (filters, duplicates),
    images without a caption, rows dropped to whole batches, the export's rows, files and
    buckets, every dropped image by name (``dropped``, also in ``dropped_file``), and a
    line on the output folder."""

    images: int = 0
    uncaptioned: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    files: int = 0
    buckets: dict[str, int] = field(default_factory=dict)
    shortfall: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    dropped_file: Path | None = None
    folder: str = ""

    def counts(self) -> dict[str, int]:
        """Dropped images by reason."""
        return dict(Counter(d.reason for d in self.dropped).most_common())

    def summary(self) -> str:
        rejects = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"
        counts = self.counts()
        line = (
            f"{self.images} images: {self.rows} rows in {self.files} shard(s) "
            f"(buckets {self.buckets}); rejected: {rejects}; without a caption: {self.uncaptioned}"
        )
        if counts.get(INCOMPLETE_BATCH):
            line += f"; dropped to whole batches: {counts[INCOMPLETE_BATCH]}"
        if self.dropped_file is not None:
            line += f"; names in {self.dropped_file} (--verbose prints them)"
        return line

    def lines(self, verbose: bool = False) -> list[str]:
        """What ``krea2 train prepare`` prints: the summary, the output folder, what to
        change, and (``verbose``) every dropped image with its reason."""
        out = [self.summary(), self.folder, *self.shortfall]
        if verbose:
            out += [f"  dropped {d.image}: {d.reason} {d.detail}".rstrip() for d in self.dropped]
        return [line for line in out if line]


def stage_config(side: int, min_side: int | None = None):
    """The warehouse's thresholds for the resolution stage closest to ``side`` at or below
    it (256, 512, 1024), with ``min_side`` overriding the minimum image size."""
    from krea2.curate.config import CurateConfig

    cfg = CurateConfig()
    fitting = [int(s) for s in cfg.stages if int(s) <= side] or [min(int(s) for s in cfg.stages)]
    cfg = replace(cfg, stage=str(max(fitting)))
    if min_side is not None:
        stages = dict(cfg.stages)
        stages[cfg.stage] = replace(stages[cfg.stage], min_side=min_side)
        cfg = replace(cfg, stages=stages)
    return cfg


def _dropped_file(
    result: PrepareResult, out: Path, rel: Callable[[str], str]
) -> Callable[[ExportStats], dict[str, str]]:
    """The export's ``side_files``: with the rows packed, add the ones dropped to whole
    batches or undecodable to ``result.dropped`` (``rel``: a sample key → the image's path
    in the folder), and name them all in ``dropped.tsv``."""

    def side_files(stats: ExportStats) -> dict[str, str]:
        result.dropped += [
            Dropped(rel(k), why, detail)
            for k, why, detail in packing_losses(
                stats.batch_size, stats.dropped_keys, stats.failed_keys
            )
        ]
        if not result.dropped:
            return {}
        result.dropped_file = out / DROPPED_FILE
        rows = ((d.image, d.reason, d.detail) for d in result.dropped)
        return {DROPPED_FILE: dropped_tsv("image", rows)}

    return side_files


def prepare_folder(
    folder: Path,
    out: Path,
    side: int = 1024,
    stage: str | None = None,
    min_side: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
) -> PrepareResult:
    """Curate ``folder`` (images with sidecar captions: ``<name>.txt`` or ``<name>.json``)
    and write shards for the trainer's ``stages.N.data`` into ``out`` (new, empty or an
    earlier export, replaced). Images without a caption are skipped and counted; every
    image left out is named in ``out/dropped.tsv``; UserError when nothing is left to write."""
    from krea2.curate.export import Sample, export_shards
    from krea2.curate.export_folder import ExportFolder
    from krea2.curate.in_memory import curate_in_memory
    from krea2.curate.sidecars import sidecar_captions
    from krea2.curate.sources import Skipped, list_source
    from krea2.curate.storage import read_uri

    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder of images with .txt captions")
    ExportFolder.claim(out)  # a folder that cannot take the shards fails before the work
    skipped = Skipped()
    rows = list(list_source(folder, folder.name, skipped=skipped))
    result = PrepareResult(images=len(rows))
    result.dropped += [Dropped(path, "skipped", why) for path, why in skipped.files]

    def rel(key: str) -> str:
        return key.removeprefix(f"{folder.name}/")  # keys are source/relative path

    keys, datas, captions, uris, metas = [], [], [], [], []
    for row in rows:
        found = sidecar_captions(row["meta"])  # checked when listed: never malformed here
        if not found:
            result.uncaptioned += 1
            result.dropped.append(Dropped(rel(row["image_key"]), NO_CAPTION))
            continue
        keys.append(row["image_key"])
        datas.append(read_uri(row["uri"]))
        captions.append(found)
        uris.append(row["uri"])
        metas.append((row["meta"] or {}) | {"source": folder.name})
    if not keys:
        raise UserError(
            f"no image in {folder} has a caption; put one in <image name>.txt "
            '(or a "caption" in <image name>.json)'
        )
    verdicts = curate_in_memory(keys, datas, stage_config(side, min_side))
    result.rejected = dict(Counter(v.reason for v in verdicts if v.reason is not None))
    result.dropped += [
        Dropped(rel(v.key), v.reason, f"of {rel(v.dup_of)}" if v.dup_of else "")
        for v in verdicts
        if v.reason is not None
    ]
    samples = [
        Sample(key=k, data=d, captions=c, uri=u, meta=m)
        for k, d, c, u, m, v in zip(keys, datas, captions, uris, metas, verdicts, strict=True)
        if v.reason is None
    ]
    # written even when every image was rejected: the list says which and why
    side_files = _dropped_file(result, out, rel)
    stats = export_shards(
        samples, out, stage or f"user-{side}", side, seed, batch_size, side_files=side_files
    )
    if not samples:
        raise UserError(f"every image of {folder} was rejected: {result.rejected}; see {out}")
    result.rows, result.files, result.buckets = stats.rows, stats.files, dict(stats.buckets)
    result.shortfall, result.folder = stats.shortfall(), stats.folder
    return result


def main() -> None:
    import typer

    def command(
        folder: Path = typer.Argument(..., help="images with <name>.txt captions beside them"),
        out: Path = typer.Option(..., "--out", help="output folder for the Parquet shards"),
        side: int = typer.Option(1024, "--side", help="nominal side of the training stage"),
        min_side: int = typer.Option(None, "--min-side", help="smallest image side kept"),
        batch_size: int = typer.Option(None, "--batch-size", help="rows per packed batch"),
        verbose: bool = typer.Option(False, "--verbose", help="name every dropped image"),
    ) -> None:
        """Curate a folder of captioned images into training shards.

        Example: python -m krea2.curate.prepare my-photos --out shards/mine --side 1024
        """
        result = prepare_folder(folder, out, side, None, min_side, 0, batch_size)
        for line in result.lines(verbose):
            typer.echo(line)

    typer.run(command)


if __name__ == "__main__":
    main()
