"""A user's folder of images with ``.txt`` captions -> training shards, through the same
decode checks, cheap filters, exact/near dedup and aspect buckets as the warehouse.

Fine-tuning sets are small (tens to thousands of images), so the DAG runs in memory
(:func:`krea2.curate.curate_in_memory`) instead of through Postgres; each kept image
is exported by :func:`krea2.curate.export_shards` with its caption as the ``long`` format
(the trainer falls back to it whatever its caption weights). Run it as
``python -m krea2.curate.prepare FOLDER --out shards/ --side 1024``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from krea2.infra.errors import UserError

CAPTION_SUFFIX = ".txt"


@dataclass
class PrepareResult:
    """What became of a folder: images found, rejects by reason (filters, duplicates),
    images without a caption file, and the export's rows, files and buckets."""

    images: int = 0
    uncaptioned: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    files: int = 0
    buckets: dict[str, int] = field(default_factory=dict)
    shortfall: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rejects = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"
        return (
            f"{self.images} images: {self.rows} rows in {self.files} shard(s) "
            f"(buckets {self.buckets}); rejected: {rejects}; without a caption: {self.uncaptioned}"
        )


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


def prepare_folder(
    folder: Path,
    out: Path,
    side: int = 1024,
    stage: str | None = None,
    min_side: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
) -> PrepareResult:
    """Curate ``folder`` (images, each with ``<name>.txt`` beside it) and write shards for
    the trainer's ``stages.N.data`` into ``out``. Images without a caption are skipped and
    counted; UserError when nothing is left to write."""
    from krea2.curate import Sample, curate_in_memory, export_shards, read_uri
    from krea2.curate.sources import list_source

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder of images with .txt captions")
    rows = list(list_source(folder, folder.name))
    result = PrepareResult(images=len(rows))
    keys, datas, captions, uris = [], [], [], []
    for row in rows:
        image = folder / row["image_key"].removeprefix(f"{folder.name}/")  # key: source/rel
        text_file = image.with_suffix(CAPTION_SUFFIX)
        if not text_file.is_file() or not text_file.read_text().strip():
            result.uncaptioned += 1
            continue
        keys.append(row["image_key"])
        datas.append(read_uri(row["uri"]))
        captions.append(text_file.read_text().strip())
        uris.append(row["uri"])
    if not keys:
        raise UserError(f"no image in {folder} has a caption; put one in <image name>.txt")
    verdicts = curate_in_memory(keys, datas, stage_config(side, min_side))
    result.rejected = dict(Counter(v.reason for v in verdicts if v.reason is not None))
    samples = [
        Sample(key=k, data=d, captions={"long": c}, uri=u, meta={"source": folder.name})
        for k, d, c, u, v in zip(keys, datas, captions, uris, verdicts, strict=True)
        if v.reason is None
    ]
    if not samples:
        raise UserError(f"every image of {folder} was rejected: {result.rejected}")
    stats = export_shards(samples, Path(out), stage or f"user-{side}", side, seed, batch_size)
    result.rows, result.files, result.buckets = stats.rows, stats.files, dict(stats.buckets)
    result.shortfall = stats.shortfall()
    return result


def main() -> None:
    import typer

    def command(
        folder: Path = typer.Argument(..., help="images with <name>.txt captions beside them"),
        out: Path = typer.Option(..., "--out", help="output folder for the Parquet shards"),
        side: int = typer.Option(1024, "--side", help="nominal side of the training stage"),
        min_side: int = typer.Option(None, "--min-side", help="smallest image side kept"),
        batch_size: int = typer.Option(None, "--batch-size", help="rows per packed batch"),
    ) -> None:
        """Curate a folder of captioned images into training shards.

        Example: python -m krea2.curate.prepare my-photos --out shards/mine --side 1024
        """
        result = prepare_folder(folder, out, side, None, min_side, 0, batch_size)
        typer.echo(result.summary())
        for line in result.shortfall:
            typer.echo(line)

    typer.run(command)


if __name__ == "__main__":
    main()
