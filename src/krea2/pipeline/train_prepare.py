"""``krea2 train prepare FOLDER``: curate's folder preparation as a sub-command of the
trainer's CLI group.

krea2-trainer may not import krea2-curate (the dependency graph runs curate and trainer
side by side), so the umbrella, which may use both, registers this function in the
``krea2.cli.train`` entry-point group and the ``krea2`` host adds it to ``krea2 train``
(``krea2.infra.host.add_subcommands``). Same as ``python -m krea2.curate.prepare``.
"""

from __future__ import annotations

from pathlib import Path

import typer


def prepare(
    folder: Path = typer.Argument(
        ..., help='images with captions beside them: <name>.txt, or "caption" in <name>.json'
    ),
    out: Path = typer.Option(
        ..., "--out", help="output folder for the Parquet shards (new, empty or an earlier one)"
    ),
    side: int = typer.Option(1024, "--side", help="nominal side of the training stage"),
    min_side: int = typer.Option(None, "--min-side", help="smallest image side kept"),
    batch_size: int = typer.Option(None, "--batch-size", help="rows per packed batch"),
    verbose: bool = typer.Option(False, "--verbose", help="name every dropped image"),
) -> None:
    """Curate a folder of captioned images into training shards (curate's decode checks,
    cheap filters, exact and near dedup, aspect buckets). Captions follow `krea2 curate
    ingest`'s sidecars; images left out are named in OUT/dropped.tsv.

    Example: krea2 train prepare my-photos --out shards/mine --side 1024
    """
    from krea2.curate import prepare_folder

    result = prepare_folder(folder, out, side, None, min_side, 0, batch_size)
    for line in result.lines(verbose):
        typer.echo(line)
